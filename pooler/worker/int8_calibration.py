"""The load-time calibration forward for int8 smoothing (pooler/layers/quantization.py).

SmoothQuant-style smoothing needs each linear layer's largest |input| per channel. They are
measured once at load by one fp32 forward of ten built-in English texts (398 tokens for
all-MiniLM-L6-v2: a fifth of one step of the precision check's token budget), tokenized with the
model's own tokenizer. The texts are
fixed, so two loads of the same weights pick the same factors (reload_weights relies on it),
and they are not the benchmark corpus the accuracy is measured on.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch
from torch import nn

from pooler.config import ModelConfig
from pooler.models.inputs import ModelInputs
from pooler.tokenizer import TextTokenizer

logger = logging.getLogger(__name__)

# Plain prose of several lengths and registers: a query, questions, facts, a list, numbers.
CALIBRATION_TEXTS = (
    "how do I reset my password",
    "What is the capital of Australia, and why was it chosen over Sydney?",
    "The river rises in the northern hills, runs south past three old mill towns and reaches "
    "the sea after about two hundred kilometres. Its lower valley floods most winters, which "
    "is why the villages there were built on the higher ground to the east.",
    "Preheat the oven to 180 degrees. Mix 250 g of flour, two eggs, 100 ml of milk and a pinch "
    "of salt; bake for 35 minutes or until golden. Serves four.",
    "Error 404: the page you requested could not be found. Check the address, or go back to "
    "the home page and use the search box at the top.",
    "In 1969 two astronauts walked on the Moon while a third orbited above them. The mission "
    "lasted eight days, and the samples it brought back are still studied today by "
    "geologists who want to know how the Moon formed and why its crust differs from ours.",
    "Our quarterly revenue grew 12% to $4.3 million, driven by new customers in Europe; "
    "operating costs were flat, and we expect similar growth next quarter.",
    "A library is a collection of books, journals and other media kept for people to read or "
    "borrow. Public libraries are open to everyone, while school and university libraries "
    "serve their students and staff. Many now lend e-books and offer computers, classes and "
    "quiet rooms, and some run programmes for children, job seekers and older readers who "
    "want to learn new skills. Librarians help visitors find what they need, keep the "
    "catalogue in order and choose what to buy with a budget that is rarely large enough.",
    "Sorry, I can't make it on Friday - could we move the meeting to Monday morning?",
    "The patient reported mild headaches and fatigue for two weeks; blood pressure was "
    "normal and no medication was prescribed. A follow-up visit is planned in one month.",
)


def calibration_inputs(model_config: ModelConfig) -> ModelInputs:
    """CALIBRATION_TEXTS as one packed batch, truncated to the model's length."""
    lowercase = bool(model_config.st and model_config.st.do_lower_case)
    tokenizer = TextTokenizer(model_config.path, model_config.tokenizer_config,
                              lowercase=lowercase)
    encoded = tokenizer.encode_batch(list(CALIBRATION_TEXTS),
                                     max_length=model_config.max_model_len)
    lens = [len(e.input_ids) for e in encoded]
    return ModelInputs(
        input_ids=torch.tensor([i for e in encoded for i in e.input_ids]),
        positions=torch.cat([torch.arange(n) for n in lens]),
        token_type_ids=None,  # one segment, as single texts run
        cu_seqlens=torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32),
        seq_lens=lens, max_seqlen=max(lens))


def calibration_forward(model_config: ModelConfig) -> Callable[[nn.Module], None] | None:
    """run(backbone): the calibration forward apply_quantization records ranges during; None
    where the model folder has no tokenizer to make the inputs (int8 then runs unsmoothed)."""
    try:
        inputs = calibration_inputs(model_config)
    except (OSError, ValueError) as e:
        logger.info("int8 smoothing off: no calibration inputs (%s)", e)
        return None

    def run(backbone: nn.Module) -> None:
        with torch.inference_mode():
            backbone(inputs)

    return run

"""pooler/bench/modernbert_tokenizer.py: the stand-in ModernBERT tokenizer the bench's and the
tests' seeded folders share. The fixtures' configs hard-code its special ids, and parity tests
rely on it coming out the same on every build."""
from pooler.bench.modernbert_tokenizer import IMAGE_TOKENS, modernbert_bpe, \
    save_colmodernvbert_processor

CORPUS = ["the quick brown fox jumps over the lazy dog", "a page with a revenue chart"] * 4


def test_special_ids_and_template_are_modernberts():
    tok = modernbert_bpe(CORPUS, vocab_size=300, model_max_length=64)
    # tests/models/modernbert_folders.py's config: cls 1, sep 2, pad 3
    assert [tok.convert_tokens_to_ids(t) for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]")] == \
        [0, 1, 2, 3]
    ids = tok("the fox")["input_ids"]
    assert ids[0] == 1 and ids[-1] == 2 and len(ids) > 2
    assert tok.model_max_length == 64


def test_same_corpus_same_tokenizer():
    a, b = (modernbert_bpe(CORPUS, vocab_size=300, model_max_length=64) for _ in range(2))
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()


def test_processor_carries_the_image_tokens(tmp_path):
    tok = save_colmodernvbert_processor(tmp_path, CORPUS, vocab_size=300, model_max_length=64,
                                        longest_edge=96, tile=32, image_seq_len=16)
    assert (tmp_path / "processor_config.json").is_file()
    assert all(tok.convert_tokens_to_ids(t) != tok.unk_token_id for t in IMAGE_TOKENS)
    assert len(tok) == tok.backend_tokenizer.get_vocab_size(with_added_tokens=False) + \
        len(IMAGE_TOKENS)

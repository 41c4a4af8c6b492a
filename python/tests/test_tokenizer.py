"""libmoe.Tokenizer: the ids and texts of Hugging Face's tokenizers (the fixtures dev/gen_tokenizer_fixtures.js
made with @lenml/tokenizers, on the files scripts/get-tokenizers.sh fetches into data/tokenizers; skipped
without them), and libmoe's own trained tokenizer round-tripping through its file."""
import json
import os
import tempfile
import unittest

from common import ROOT, libmoe, raises

MODELS = ("qwen3", "deepseek_v3", "gptoss", "llama2", "llama3")


FETCHED = [m for m in MODELS if os.path.exists(os.path.join(ROOT, "data", "tokenizers", m, "tokenizer.json"))]


class TokenizerTest(unittest.TestCase):
    # the C suite's tokenizer_model_* tests report the models as skipped without the files; here the test
    # exists only with them (tests/test_python.c wants every Python test run)
    if FETCHED:
        def test_models_match_reference(self):
            for m in FETCHED:
                tok = libmoe.Tokenizer(os.path.join(ROOT, "data", "tokenizers", m, "tokenizer.json"))
                with open(os.path.join(ROOT, "tests", "fixtures", "tokenizers", m, "expected.json")) as f:
                    cases = json.load(f)
                for c in cases[:40]:
                    ids = tok.encode(c["text"], add_special=c["add_special"]).tolist()
                    self.assertEqual(ids, c["ids"], f"{m}: {c['text'][:40]!r}")
                    self.assertEqual(tok.decode(ids), c["decoded"], f"{m}: decode {c['text'][:40]!r}")

    def test_trained_round_trip(self):
        text = "the cat sat on the mat. caf\u00e9 na\u00efve <|endoftext|> the end"
        tok = libmoe.Tokenizer.train(text, 300)
        self.assertTrue(256 < tok.vocab_size <= 300)  # fewer when the text runs out of merges
        eot = tok.token_id("<|endoftext|>")
        self.assertEqual(eot, tok.vocab_size - 1)
        self.assertIn(eot, tok.encode(text, special=True).tolist())
        self.assertNotIn(eot, tok.encode(text).tolist())
        self.assertEqual(tok.decode(tok.encode(text)), text)
        with tempfile.TemporaryDirectory() as d:
            tok.save(os.path.join(d, "tokenizer.json"))
            again = libmoe.Tokenizer(d)
            self.assertEqual(again.encode(text).tolist(), tok.encode(text).tolist())
        raises(self, "MOE_ERR_IO", libmoe.Tokenizer, os.path.join(ROOT, "nope.json"))

    def test_more_ids_than_bytes(self):
        """A SentencePiece-style file (a seed of the fuzz target: Llama 2's pipeline on a tiny vocabulary):
        "\n" is BOS, a prepended "\u2581" and the byte fallback <0x0A>, three ids for one byte."""
        tok = libmoe.Tokenizer(os.path.join(ROOT, "fuzz", "corpus", "tokenizer_json", "llama2.json"))
        ids = tok.encode("\n", add_special=True)
        self.assertEqual(len(ids), 3)
        self.assertEqual(ids[0], tok.token_id("<s>"))
        self.assertTrue(tok.decode(ids).endswith("\n"))


if __name__ == "__main__":
    unittest.main()

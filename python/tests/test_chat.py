"""Chat templates from Python against the fixtures of @huggingface/jinja (dev/gen_chat_fixtures.js)."""
import json
import os
import unittest

from common import ROOT, libmoe
from libmoe.chat import render_chat, render_chat_template

CHAT = os.path.join(ROOT, "tests", "fixtures", "chat")
NOW = 1720170487  # the generator's clock


class Chat(unittest.TestCase):
    def test_model_cases(self):
        with open(os.path.join(CHAT, "qwen3", "cases.json")) as f:
            cases = [c for c in json.load(f) if "expected" in c]
        self.assertGreater(len(cases), 10)
        for c in cases:
            got = render_chat(os.path.join(CHAT, "qwen3"), c["conversation"], c["add_generation_prompt"], NOW)
            self.assertEqual(got, c["expected"], c["name"])

    def test_language_and_errors(self):
        with open(os.path.join(CHAT, "lang.json")) as f:
            cases = {c["name"]: c for c in json.load(f)}
        for name in ("macro", "namespace", "filter_tojson", "strftime_now", "case_unicode"):
            c = cases[name]
            self.assertEqual(render_chat_template(c["template"], c["context"], NOW), c["expected"], name)
        with self.assertRaises(libmoe.MoeError) as e:
            render_chat_template("{{ 'x' | frobnicate }}")
        self.assertEqual(e.exception.name, "MOE_ERR_VALUE")
        self.assertIn("unknown filter 'frobnicate' for a string at 1:10", e.exception.message)


if __name__ == "__main__":
    unittest.main()

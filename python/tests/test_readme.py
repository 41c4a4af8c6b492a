"""The README's Python example runs, and prints what its comment says."""
import contextlib
import io
import os
import re
import unittest

from common import ROOT


class Readme(unittest.TestCase):
    def test_python_example(self):
        with open(os.path.join(ROOT, "README.md")) as f:
            text = f.read()
        section = text[text.index("\n## Python\n"):]
        code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md (## Python)", "exec"), {})
        said = re.search(r"print\(e.name, e.message\)\s+# (.*)", code).group(1)
        self.assertEqual(out.getvalue().strip(), said)

    def test_language_model_example(self):
        with open(os.path.join(ROOT, "README.md")) as f:
            text = f.read()
        section = text[text.index("\n### The language model from Python\n"):]
        code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
        here = os.getcwd()
        os.chdir(ROOT)  # its checkpoint path is the repository's
        try:
            with contextlib.redirect_stdout(io.StringIO()) as out:
                exec(compile(code, "README.md (### The language model from Python)", "exec"), {})
        finally:
            os.chdir(here)
        self.assertEqual(len(out.getvalue().split("\n")), 5)  # four tokens with their log-probabilities


if __name__ == "__main__":
    unittest.main()

"""The README's Python examples run, and print what their comments say."""
import contextlib
import io
import os
import re
import unittest

from common import ROOT


def example(heading):
    """The first ```python block after the README's heading line."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text[text.index("\n" + heading + "\n"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run(code, heading):
    """What the code prints, run from the repository (its paths are the repository's)."""
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            exec(compile(code, "README.md (" + heading + ")", "exec"), {})
    finally:
        os.chdir(here)
    return out.getvalue()


class Readme(unittest.TestCase):
    def test_python_example(self):
        code = example("## Python")
        said = re.search(r"print\(e.name, e.message\)\s+# (.*)", code).group(1)
        self.assertEqual(run(code, "## Python").strip(), said)

    def test_language_model_example(self):
        heading = "### The language model from Python"
        self.assertEqual(len(run(example(heading), heading).split("\n")), 5)  # four tokens, their log-probabilities

    def test_training_example(self):
        heading = "### Training a language model from Python"
        losses = [float(line.split()[1]) for line in run(example(heading), heading).strip().split("\n")]
        self.assertEqual(len(losses), 3)
        self.assertLess(losses[2], losses[0])


if __name__ == "__main__":
    unittest.main()

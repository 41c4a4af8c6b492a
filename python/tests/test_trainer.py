"""libmoe.Trainer: a run trained from Python (the tokenizer, the model and the token streams made as
`moe train --task lm` makes them, the library's loop) stopped half way and resumed by `moe train
--resume`, and a `moe train` run resumed by Trainer.resume, log the uninterrupted CLI run's step losses
and end with its weights, bit for bit (MOE_CLI, which tests/test_python.c sets)."""
import json
import os
import re
import struct
import subprocess
import tempfile
import unittest

import numpy as np

from common import libmoe, raises

SENTENCES = ["the cat sat on the mat .", "a dog ran in the park and the cat ran too .",
             "we saw the old man by the river .", "she read the book while it rained outside .",
             "the children played a game on the green grass ."]
TINY = dict(context=16, batch=4, steps=40, eval_every=10, lr=3e-3)
TINY_FLAGS = ["--vocab", "320", "--context", "16", "--batch", "4", "--layers", "1", "--model", "32", "--heads", "2",
              "--kv-heads", "1", "--experts", "4", "--hidden", "32", "--steps", "40", "--eval-every", "10", "--lr",
              "3e-3", "--threads", "1"]


def corpus(d):
    """train.txt and valid.txt: documents of a few sentences in a fixed order, an empty line between."""
    for name, n, k in (("train.txt", 60, 7), ("valid.txt", 20, 3)):
        docs = [" ".join(SENTENCES[(i * k + j) % 5] for j in range(1 + i % 3)) for i in range(n)]
        with open(os.path.join(d, name), "w") as f:
            f.write("\n\n".join(docs) + "\n")


def step_losses(out):
    """The --log-steps lines' losses as printed ({"step": N, "loss": X}), in order."""
    return re.findall(r'^\{"step": \d+, "loss": ([-+.0-9a-z]+)\}$', out, re.M)


def scratch(test, prefix):
    """MOE_CLI and a new directory; the test skips without MOE_CLI."""
    cli = os.environ.get("MOE_CLI")
    if not cli:
        test.skipTest("MOE_CLI not set (tests/test_python.c sets it)")
    return cli, tempfile.mkdtemp(prefix=prefix)


class TrainerTest(unittest.TestCase):
    def test_python_run_resumes_bit_for_bit_in_moe_train(self):
        cli, d = scratch(self, "libmoe_trainer_")
        corpus(d)
        full_ck, py_ck = os.path.join(d, "full"), os.path.join(d, "py")
        run = lambda *a: subprocess.run([cli, "train", "--task", "lm", *a], capture_output=True, text=True,
                                        check=True).stdout
        full = run("--data", d, *TINY_FLAGS, "--json", "--log-steps", "--checkpoint", full_ck)
        want = step_losses(full)
        self.assertEqual(len(want), 40)

        with open(os.path.join(d, "train.txt"), "rb") as f:
            train_text = f.read()
        with open(os.path.join(d, "valid.txt"), "rb") as f:
            valid_text = f.read()
        tok = libmoe.Tokenizer.train(train_text, 320)
        lm = libmoe.LM.create(tok.vocab_size, 16, layers=1, model=32, heads=2, kv_heads=1, experts=4, hidden=32,
                              seed=1, threads=1)
        seen = []
        tr = libmoe.Trainer(lm, libmoe.lm_stream(tok, train_text), libmoe.lm_stream(tok, valid_text), tokenizer=tok,
                            checkpoint=py_ck, stop_after=20, callback=seen.append, **TINY)
        steps = tr.run()
        self.assertEqual(seen, steps)  # the callback saw every step's numbers
        self.assertEqual([s["step"] for s in steps], list(range(1, 21)))
        self.assertEqual(["%.9g" % s["ce"] for s in steps], want[:20])
        self.assertEqual([s["step"] for s in steps if s["valid_loss"] is not None], [10, 20])
        self.assertEqual(tr.info()["step"], 20)
        del tr

        rest = run("--resume", py_ck, "--data", d, "--threads", "1", "--json", "--log-steps")
        self.assertEqual(step_losses(rest), want[20:])
        self.assertEqual(rest.splitlines()[-1], full.splitlines()[-1])  # the last validation loss
        for f in ("model.safetensors", "config.json", "tokenizer.json"):
            with open(os.path.join(full_ck, f), "rb") as a, open(os.path.join(py_ck, f), "rb") as b:
                self.assertTrue(a.read() == b.read(), f)

    def resumed_in_python(self, flags):
        """`moe train --task lm` with flags run whole and stopped at step 20, the latter resumed by
        Trainer.resume: the whole run's losses and model.safetensors, bit for bit; that file's path."""
        cli, d = scratch(self, "libmoe_trainer_")
        corpus(d)
        full_ck, half_ck = os.path.join(d, "full"), os.path.join(d, "half")
        run = lambda *a: subprocess.run([cli, "train", "--task", "lm", "--data", d, *flags, "--json",
                                         "--log-steps", *a], capture_output=True, text=True, check=True).stdout
        want = step_losses(run("--checkpoint", full_ck))
        self.assertEqual(step_losses(run("--checkpoint", half_ck, "--stop-after", "20")), want[:20])
        tok = libmoe.Tokenizer(os.path.join(half_ck, "tokenizer.json"))
        with open(os.path.join(d, "train.txt"), "rb") as f:
            train = libmoe.lm_stream(tok, f.read())
        with open(os.path.join(d, "valid.txt"), "rb") as f:
            valid = libmoe.lm_stream(tok, f.read())
        tr = libmoe.Trainer.resume(half_ck, train, valid, tokenizer=tok, threads=1)
        self.assertEqual(tr.info()["step"], 20)
        self.assertEqual(["%.9g" % s["ce"] for s in tr.run()], want[20:])
        del tr
        with open(os.path.join(full_ck, "model.safetensors"), "rb") as a, \
                open(os.path.join(half_ck, "model.safetensors"), "rb") as b:
            self.assertTrue(a.read() == b.read())
        return os.path.join(full_ck, "model.safetensors")

    def test_moe_train_run_resumes_bit_for_bit_in_python(self):
        self.resumed_in_python(TINY_FLAGS)

    def test_bias_rate_run_resumes_bit_for_bit_in_python(self):
        # DeepSeek-V3 with the aux-loss-free balancing: Trainer.resume takes bias_rate from the trainer state
        path = self.resumed_in_python([*TINY_FLAGS, "--layers", "2", "--experts", "8", "--family", "deepseek_v3",
                                       "--bias-rate", "0.01"])
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            t = json.loads(f.read(n))["model.layers.1.mlp.gate.e_score_correction_bias"]
            f.seek(8 + n + t["data_offsets"][0])
            bias = np.frombuffer(f.read(t["data_offsets"][1] - t["data_offsets"][0]), np.float32)
        self.assertTrue(np.any(bias != 0))  # the balancing ran

    def test_bad_options(self):
        tok = libmoe.Tokenizer.train(" ".join(SENTENCES) * 20, 300)
        lm = libmoe.LM.create(tok.vocab_size, 8, layers=1, model=16, heads=2, kv_heads=1, experts=2, hidden=8)
        ids = libmoe.lm_stream(tok, " ".join(SENTENCES) * 5)
        with self.assertRaises(TypeError):
            libmoe.Trainer(lm, ids, ids, stepz=3)
        raises(self, "MOE_ERR_ARG", libmoe.Trainer, lm, ids[:5], ids, context=8, contains="fewer than one window")
        raises(self, "MOE_ERR_ARG", libmoe.Trainer, lm, ids, ids, context=9, contains="max_position_embeddings")
        raises(self, "MOE_ERR_ARG", libmoe.Trainer, lm, ids, ids, context=8, bias_rate=1e-3, contains="selection bias")


def idx_data(d):
    """train- and t10k- IDX files: 8x8 images, each of 10 classes a noisy bright square at its own place."""
    rng = np.random.default_rng(5)
    for split, n in (("train", 256), ("t10k", 64)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        img = rng.integers(0, 60, (n, 8, 8))
        for i, c in enumerate(labels):
            img[i, (c // 5) * 4:(c // 5) * 4 + 3, (c % 5):(c % 5) + 3] += 180
        with open(os.path.join(d, f"{split}-images-idx3-ubyte"), "wb") as f:
            f.write(struct.pack(">IIII", 0x803, n, 8, 8) + img.astype(np.uint8).tobytes())
        with open(os.path.join(d, f"{split}-labels-idx1-ubyte"), "wb") as f:
            f.write(struct.pack(">II", 0x801, n) + labels.tobytes())


class ClassifierTrainerTest(unittest.TestCase):
    def test_python_classifier_run_logs_moe_trains_losses(self):
        cli, d = scratch(self, "libmoe_cls_")
        idx_data(d)
        out = subprocess.run([cli, "train", "--data", d, "--experts", "4", "--top-k", "2", "--hidden", "32", "--model",
                              "32", "--blocks", "2", "--batch", "32", "--epochs", "3", "--seed", "3", "--lr", "3e-3",
                              "--threads", "1", "--json", "--log-steps", "--checkpoint", os.path.join(d, "cli.st")],
                             capture_output=True, text=True, check=True).stdout
        rows = [json.loads(line) for line in out.splitlines()]
        want = ["%.9g" % r["loss"] for r in rows if "step" in r and "epoch" not in r]
        epochs = [r for r in rows if "epoch" in r]
        self.assertEqual(len(want), 24)

        train, test = libmoe.load_split(d, "train"), libmoe.load_split(d, "t10k")
        model = libmoe.Model(in_dim=64, classes=10, blocks=2, D=32, H=32, E=4, top_k=2, act="gelu", inner_top_k=1,
                             threads=1)
        model.init_params(3)
        evals = []
        tr = libmoe.Trainer.classifier(model, train, test, epochs=3, batch=32, seed=3, lr=3e-3,
                                       checkpoint=os.path.join(d, "py.st"),
                                       callback=lambda s: s["valid_accuracy"] is not None and evals.append(s))
        steps = tr.run()
        self.assertEqual(["%.9g" % s["loss"] for s in steps], want)
        self.assertEqual([s["step"] for s in evals], [8, 16, 24])
        self.assertEqual(["%.4f" % s["valid_accuracy"] for s in evals], ["%.4f" % e["test_accuracy"] for e in epochs])
        for s in evals:
            self.assertEqual(s["valid_loss"], 1 - s["valid_accuracy"])
        self.assertGreater(evals[-1]["valid_accuracy"], 0.3)  # 10 classes: chance is 0.1
        # the checkpoint is the CLI's, byte for byte: its weights, Adam's state and the training options
        with open(os.path.join(d, "cli.st"), "rb") as a, open(os.path.join(d, "py.st"), "rb") as b:
            self.assertTrue(a.read() == b.read())

        # stopped after the first epoch in Python, resumed by moe train: the CLI's losses and checkpoint
        model = libmoe.Model(in_dim=64, classes=10, blocks=2, D=32, H=32, E=4, top_k=2, act="gelu", inner_top_k=1,
                             threads=1)
        model.init_params(3)
        half = os.path.join(d, "half.st")
        tr = libmoe.Trainer.classifier(model, train, test, epochs=3, batch=32, seed=3, lr=3e-3, checkpoint=half,
                                       stop_after=8)
        self.assertEqual(["%.9g" % s["loss"] for s in tr.run()], want[:8])
        del tr
        out = subprocess.run([cli, "train", "--data", d, "--resume", half, "--threads", "1", "--json", "--log-steps"],
                             capture_output=True, text=True, check=True).stdout
        rows = [json.loads(line) for line in out.splitlines()]
        self.assertEqual(["%.9g" % r["loss"] for r in rows if "step" in r and "epoch" not in r], want[8:])
        with open(os.path.join(d, "cli.st"), "rb") as a, open(half, "rb") as b:
            self.assertTrue(a.read() == b.read())

"""libmoe.LM and libmoe.Engine on the language-model fixtures (tests/fixtures/lm: Mixtral and Qwen3-MoE):
generate gives `moe generate`'s tokens for the same options (run as a subprocess: MOE_CLI, which
tests/test_python.c sets), greedy and sampled; logprobs are those of a full forward's logits; the engine
serving several requests at once gives each the tokens it gets alone; a GGUF file of the Mixtral fixture
runs as the directory does."""
import json
import os
import subprocess
import unittest

import numpy as np

from common import ROOT, libmoe, raises

LM_DIR = os.path.join(ROOT, "tests", "fixtures", "lm")
CASES = [([5, 9, 1], dict(max_tokens=12, temperature=0.8, top_p=0.9, seed=3)),
         ([7, 7, 2, 30], dict(max_tokens=10, temperature=0.0)),
         ([3], dict(max_tokens=8, temperature=1.3, seed=11, ignore_eos=True))]


def moe_generate(ck, prompt, opts):
    args = [os.environ["MOE_CLI"], "generate", "--checkpoint", ck, "--json", "--prompt-ids", " ".join(map(str, prompt)),
            "--max-tokens", str(opts["max_tokens"]), "--temperature", str(opts.get("temperature", 1.0)),
            "--top-p", str(opts.get("top_p", 1.0)), "--seed", str(opts.get("seed", 0))]
    args += ["--ignore-eos"] if opts.get("ignore_eos") else []
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)["ids"]


class LMTest(unittest.TestCase):
    def test_memory_budget_same_tokens_and_stats(self):
        """Experts streamed under a budget of one expert per MoE layer: the tokens and logits of the whole
        model, for every policy, with and without prefetch; the caches' stats count the reads."""
        ck = os.path.join(LM_DIR, "qwen3_moe")
        whole = libmoe.LM(ck, threads=1)
        prompt, opts = CASES[0]
        want, want_logits = whole.generate(prompt, **opts), whole.logits([5, 9, 1, 2])
        self.assertEqual(whole.expert_stats(), [])
        for policy in ("lifo", "lru", "fifo", "lfu", "lfru"):
            for prefetch in (False, True, "auto"):
                lm = libmoe.LM(ck, threads=1, memory_budget="7K", policy=policy, prefetch=prefetch)
                self.assertEqual([s["bytes_read"] for s in lm.expert_stats()], [0, 0])  # nothing read at load
                self.assertEqual(lm.generate(prompt, **opts), want, f"{policy} prefetch {prefetch}")
                self.assertTrue(np.array_equal(lm.logits([5, 9, 1, 2]), want_logits))
                st = lm.expert_stats()
                self.assertEqual([s["layer"] for s in st], [1, 2])  # layer 0 is dense
                self.assertTrue(all(s["slots"] == 1 and 0 < s["misses"] <= s["accesses"] for s in st))
                self.assertTrue(all(s["bytes_read"] == s["loads"] * 3 * 12 * 24 * 4 for s in st))
                self.assertEqual(sum(s["predicted"] for s in st) > 0, prefetch is not False)  # auto scores them too
                self.assertTrue(all(s["prefetch_skipped"] == 0 for s in st) or prefetch == "auto")
        raises(self, "MOE_ERR_ARG", libmoe.LM, ck, memory_budget="lots", contains="memory_budget")
        raises(self, "MOE_ERR_ARG", libmoe.LM, ck, memory_budget=100, contains="below one expert per MoE layer")

    def test_memory_budget_placement_and_pins(self):
        """Slots placed by a trace's simulated misses (layer 1 always uses expert 0, layer 2 cycles through the
        four: 1 + 4 of 5 slots) and pins from it (one a layer, never evicted): the whole model's tokens."""
        import tempfile
        ck = os.path.join(LM_DIR, "qwen3_moe")
        prompt, opts = CASES[0]
        want = libmoe.LM(ck, threads=1).generate(prompt, **opts)
        slot = 3 * 12 * 24 * 4
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write("step,layer,expert,tokens\n" + "".join(f"{b},1,0,1\n{b},2,{b % 4},1\n" for b in range(8)))
        try:
            lm = libmoe.LM(ck, threads=1, memory_budget=5 * slot, placement="miss-cost", placement_trace=f.name)
            self.assertEqual([s["slots"] for s in lm.expert_stats()], [1, 4])
            self.assertEqual(lm.generate(prompt, **opts), want)
            lm = libmoe.LM(ck, threads=1, memory_budget=4 * slot, pin_from=f.name, pin=1)
            self.assertEqual([(s["slots"], s["pinned"], s["loads"]) for s in lm.expert_stats()], [(2, 1, 1), (2, 1, 1)])
            self.assertEqual(lm.generate(prompt, **opts), want)
            raises(self, "MOE_ERR_ARG", libmoe.LM, ck, memory_budget=5 * slot, placement="miss-cost", contains="needs a trace")
            raises(self, "MOE_ERR_ARG", libmoe.LM, ck, memory_budget=5 * slot, placement="most", contains="placement")
        finally:
            os.unlink(f.name)

    def test_generate_equals_moe_generate(self):
        if not os.environ.get("MOE_CLI"):
            self.skipTest("MOE_CLI not set (tests/test_python.c sets it)")
        for fam in ("mixtral", "qwen3_moe"):
            ck = os.path.join(LM_DIR, fam)
            lm = libmoe.LM(ck, threads=1)
            self.assertEqual(lm.family, fam)
            for prompt, opts in CASES:
                want = moe_generate(ck, prompt, opts)
                self.assertEqual(lm.generate(prompt, **opts), want, f"{fam} {prompt} {opts}")
                self.assertEqual(list(lm.stream(prompt, **opts)), want)

    def test_logprobs_equal_moe_generate(self):
        if not os.environ.get("MOE_CLI"):
            self.skipTest("MOE_CLI not set (tests/test_python.c sets it)")
        ck = os.path.join(LM_DIR, "mixtral")
        args = [os.environ["MOE_CLI"], "generate", "--checkpoint", ck, "--json", "--prompt-ids", "5 9 1", "--max-tokens",
                "6", "--temperature", "0.9", "--seed", "4", "--ignore-eos", "--logprobs", "2"]
        want = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
        ids, lps = libmoe.LM(ck, threads=1).generate([5, 9, 1], max_tokens=6, temperature=0.9, seed=4, ignore_eos=True,
                                                    logprobs=True)
        self.assertEqual(ids, want["ids"])
        np.testing.assert_allclose(lps, want["logprobs"], rtol=0, atol=1e-6)
        for top, lp in zip(want["top_logprobs"], want["logprobs"]):
            self.assertEqual(len(top), 2)
            self.assertGreaterEqual(top[0]["logprob"], max(top[1]["logprob"], lp))

    def test_logprobs_are_the_full_forwards(self):
        lm = libmoe.LM(os.path.join(LM_DIR, "mixtral"), threads=1)
        prompt = [5, 9, 1]
        ids, lps = lm.generate(prompt, max_tokens=5, temperature=0.7, seed=2, ignore_eos=True, logprobs=True)
        seq = prompt + ids
        lg = lm.logits(np.array(seq[:-1], dtype=np.int32)).astype(np.float64)  # (T, V), a forward without cache
        for k, (t, lp) in enumerate(zip(ids, lps)):
            row = lg[len(prompt) - 1 + k]
            want = row[t] - row.max() - np.log(np.exp(row - row.max()).sum())
            self.assertAlmostEqual(lp, want, delta=1e-4, msg=f"token {k}")
            self.assertLessEqual(lp, 0.0)

    def test_engine_requests_together_get_their_tokens_alone(self):
        lm = libmoe.LM(os.path.join(LM_DIR, "mixtral"), threads=1)
        prompts = [[1 + i, (7 * i) % 60, 3] for i in range(6)]
        alone = [lm.generate(p, max_tokens=9, temperature=0.0, ignore_eos=True) for p in prompts]
        with libmoe.Engine(lm, slots=4) as e:
            reqs = [e.submit(p, max_tokens=9, temperature=0.0, ignore_eos=True) for p in prompts]
            got = [list(e.stream(r)) if i % 2 else e.result(r) for i, r in enumerate(reqs)]
            self.assertEqual(got, alone)
            s = e.stats()
            self.assertEqual((s["tokens"], s["queued"], s["running"]), (6 * 9, 0, 0))
            sampled = e.result(e.submit([5, 9, 1], max_tokens=12, temperature=0.8, top_p=0.9, seed=3))
            self.assertEqual(sampled, lm.generate([5, 9, 1], max_tokens=12, temperature=0.8, top_p=0.9, seed=3))

    def test_gguf_file_is_the_checkpoint(self):
        """The Mixtral fixture as llama.cpp's converter wrote it (tests/fixtures/gguf_lm): the same logits
        and tokens as the directory."""
        ck, gguf = os.path.join(LM_DIR, "mixtral"), os.path.join(ROOT, "tests", "fixtures", "gguf_lm", "mixtral.gguf")
        a, b = libmoe.LM(ck, threads=1), libmoe.LM(gguf, threads=1)
        self.assertEqual(b.family, "mixtral")
        self.assertTrue(np.array_equal(a.logits([[5, 9, 1], [2, 7, 7]]), b.logits([[5, 9, 1], [2, 7, 7]])))
        prompt, opts = CASES[0]
        self.assertEqual(a.generate(prompt, **opts), b.generate(prompt, **opts))

    def test_errors_name_the_problem(self):
        raises(self, "MOE_ERR_IO", libmoe.LM, os.path.join(LM_DIR, "nope"))
        lm = libmoe.LM(os.path.join(LM_DIR, "mixtral"), threads=1)
        raises(self, "MOE_ERR_ARG", lm.generate, [lm.vocab], contains="want token ids")
        raises(self, "MOE_ERR_ARG", lm.generate, [1], max_tokens=lm.max_seq, contains="exceed the model's context")
        raises(self, "MOE_ERR_ARG", libmoe.LM, os.path.join(LM_DIR, "mixtral"), dtype="f16", contains="dtype")
        with libmoe.Engine(lm, slots=2) as e:
            raises(self, "MOE_ERR_ARG", e.submit, [1], max_tokens=0, contains="max_tokens")


if __name__ == "__main__":
    unittest.main()

"""PyTorch models in and out (issue #13 §2), against a real local cluster.

    torch_test.py BIN_DIR SOURCE_DIR WORK_DIR     (run by run_in_venv.sh in the torch venv)

A model spec written by `python -m flatshard.from_torch` from torch modules
plans exactly like the hand-written one; FULL checkpoints and summoned files
load into `flatshard.torch_modules.build(...)` with load_state_dict(strict=True);
and the torch GPT computes the loss the cluster reports for the same weights
and batch, so the torch modules are the workers' model.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import unittest

import numpy as np
import torch
from torch.nn import functional as F

import flatshard
from flatshard import checkpoint, from_torch, torch_modules
from local_cluster import ClusterTestCase

BIN, SOURCE, WORK = sys.argv[1:4]
del sys.argv[1:4]
HERE = os.path.dirname(os.path.abspath(__file__))


def plan(model_path: str, policy: str, world: int) -> dict:
    out = subprocess.run([os.path.join(BIN, "flatshard"), "plan", "--model", model_path,
                          "--policy", policy, "--world-size", str(world), "--json"],
                         check=True, capture_output=True, text=True).stdout
    result = json.loads(out)
    result.pop("model")  # the spec's name
    return result


def run_from_torch(factory: str, output: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flatshard.from_torch", factory, "-o", output],
                          cwd=HERE, capture_output=True, text=True)


class TorchInteropTest(ClusterTestCase):
    BIN, WORK = BIN, WORK

    def test_mlp_round_trip_and_checkpoints_load_strictly(self) -> None:
        job = self.cluster.create_job(os.path.join(SOURCE, "examples", "mlp-job.yaml"))
        module = torch_modules.build(job.model_spec())
        spec = from_torch.model_spec(module, "mlp")
        written = os.path.join(WORK, "mlp-from-torch.yaml")
        with open(written, "w") as f:
            json.dump(spec, f)
        self.assertEqual(plan(written, "module-type:Residual", 4),
                         plan(os.path.join(SOURCE, "examples", "mlp.yaml"),
                              "module-type:Residual", 4))

        list(job.train(3))
        job.save_checkpoint("full3", type="full")
        summoned_file = os.path.join(WORK, "mlp.safetensors")
        subprocess.run([os.path.join(BIN, "flatshard"), "summon", "-c", self.cluster.address,
                        "-j", job.name, "--out", summoned_file], check=True, capture_output=True)
        summoned = job.summon(as_torch=True)
        full = checkpoint.load_full(os.path.join(self.local.checkpoint_dir, "mlp-demo", "full3"))
        for source in (full.model_state(as_torch=True),
                       checkpoint.load_safetensors(summoned_file, as_torch=True), summoned):
            fresh = torch_modules.build(full.model_spec)
            fresh.load_state_dict(source, strict=True)
            for fqn, value in fresh.state_dict().items():
                torch.testing.assert_close(value, summoned[fqn], rtol=0, atol=0, msg=fqn)
        with self.assertRaises(RuntimeError):  # strict: a missing tensor is an error
            partial = dict(summoned)
            partial.pop("output.bias")
            torch_modules.build(full.model_spec).load_state_dict(partial, strict=True)

    def test_gpt_from_torch_computes_the_clusters_loss(self) -> None:
        spec_path = os.path.join(WORK, "gpt.yaml")
        made = run_from_torch("models:gpt_with_user_blocks", spec_path)
        self.assertEqual(made.returncode, 0, made.stderr)
        self.assertIn("1 tied", made.stdout)

        vocab, seq, samples, batch = 64, 16, 24, 4
        rng = np.random.default_rng(7)
        stream = rng.integers(0, vocab, size=samples * seq + 1).astype(np.int32)
        data = os.path.join(self.local.work, "tokens")
        os.makedirs(data, exist_ok=True)
        np.save(os.path.join(data, "inputs.npy"), stream[:-1].reshape(samples, seq))
        np.save(os.path.join(data, "labels.npy"), stream[1:].reshape(samples, seq))
        job = self.cluster.create_job({
            "name": "gpt-torch", "model": spec_path, "world_size": 2,
            "wrap_policy": "module-type:TransformerBlock",
            "data": {"kind": "file", "path": "tokens", "global_batch_size": batch,
                     "sequence_length": seq},
            "optimizer": {"kind": "adamw", "lr": 0.003},
        })
        self.assertEqual([(t.alias_fqn, t.primary_fqn) for t in job.model_spec().tied],
                         [("lm_head.weight", "wte.weight")])
        self.assertEqual(job.model_spec().root.children[2].children[1].type, "TransformerBlock")
        trained = 2
        list(job.train(trained))
        model = torch_modules.build(job.model_spec())
        summoned = job.summon(as_torch=True)
        model.load_state_dict(summoned, strict=True)
        self.assertIs(model.lm_head.weight, model.wte.weight)
        # A SHARDED checkpoint holds the tied weight once; it loads strictly too.
        job.save_checkpoint("sharded2", type="sharded")
        sharded = checkpoint.load(os.path.join(self.local.checkpoint_dir, "gpt-torch", "sharded2"))
        self.assertIn("lm_head.weight", sharded.manifest["tied"])
        from_files = torch_modules.build(sharded.model_spec)
        from_files.load_state_dict(sharded.model_state(as_torch=True), strict=True)
        for fqn, value in from_files.state_dict().items():
            torch.testing.assert_close(value, summoned[fqn], rtol=0, atol=0, msg=fqn)

        # Step trained+1 runs on global batch `trained`: samples (s*B + i) mod N.
        rows = [(trained * batch + i) % samples for i in range(batch)]
        inputs = torch.from_numpy(stream[:-1].reshape(samples, seq)[rows]).long()
        labels = torch.from_numpy(stream[1:].reshape(samples, seq)[rows]).long()
        with torch.no_grad():
            logits = model(inputs)
            expected = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1)).item()
        (step,) = list(job.train(1))
        self.assertEqual(step.step, trained + 1)
        self.assertAlmostEqual(step.loss, expected, delta=2e-5 * expected)
        self.assertGreater(expected, 0.5 * np.log(vocab))  # a real loss, not a constant

    def write_regression_set(self, name: str, samples: int, features: int, outputs: int,
                             seed: int) -> tuple:
        """A FILE data set `name` under the workers' data dir; its (inputs, targets)."""
        rng = np.random.default_rng(seed)
        inputs = rng.standard_normal((samples, features), dtype=np.float32)
        targets = rng.standard_normal((samples, outputs), dtype=np.float32)
        data = os.path.join(self.local.work, name)
        os.makedirs(data, exist_ok=True)
        np.save(os.path.join(data, "inputs.npy"), inputs)
        np.save(os.path.join(data, "targets.npy"), targets)
        return inputs, targets

    def assert_next_loss_is_torchs(self, job, model, inputs, targets, batch: int,
                                   done: int) -> None:
        """The cluster's next step has torch's MSE on its batch: after `done` steps it
        reads global batch `done`, samples (done*B + i) mod N."""
        rows = [(done * batch + i) % len(inputs) for i in range(batch)]
        with torch.no_grad():
            expected = F.mse_loss(model(torch.from_numpy(inputs[rows])),
                                  torch.from_numpy(targets[rows])).item()
        (step,) = list(job.train(1))
        self.assertAlmostEqual(step.loss, expected, delta=2e-5 * expected)

    def test_mlp_computes_the_clusters_loss(self) -> None:
        batch = 8
        inputs, targets = self.write_regression_set("dense", 40, 64, 16, seed=3)
        job = self.cluster.create_job({
            "name": "mlp-torch", "model": os.path.join(SOURCE, "examples", "mlp.yaml"),
            "world_size": 2, "wrap_policy": "module-type:Residual",
            "data": {"kind": "file", "path": "dense", "global_batch_size": batch},
        })
        list(job.train(2))
        model = torch_modules.build(job.model_spec())
        model.load_state_dict(job.summon(as_torch=True), strict=True)
        self.assert_next_loss_is_torchs(job, model, inputs, targets, batch, done=2)

    def test_layer_norm_without_affine_round_trips_and_computes_the_clusters_loss(self) -> None:
        # No weight keeps its width: the spec's attrs.normalized_shape does.
        batch = 8
        inputs, targets = self.write_regression_set("plain-norm", 16, 8, 4, seed=5)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16),
                                  torch.nn.LayerNorm(16, elementwise_affine=False, eps=1e-3),
                                  torch.nn.Linear(16, 4))
        job = self.cluster.create_job({
            "name": "plain-norm", "model": from_torch.model_spec(net, "plain-norm"),
            "world_size": 2, "wrap_policy": "module-type:Linear",
            "data": {"kind": "file", "path": "plain-norm", "global_batch_size": batch},
        })
        list(job.train(1))
        model = torch_modules.build(job.model_spec())
        norm = model[1]
        self.assertEqual((norm.normalized_shape, norm.elementwise_affine, norm.eps),
                         ((16,), False, 1e-3))
        model.load_state_dict(job.summon(as_torch=True), strict=True)
        self.assert_next_loss_is_torchs(job, model, inputs, targets, batch, done=1)

    def test_unsupported_module_names_its_fqn_and_type(self) -> None:
        made = run_from_torch("models:with_custom_block", os.path.join(WORK, "never.yaml"))
        self.assertEqual(made.returncode, 2)
        self.assertIn("blocks.1: models.CustomBlock is not a module type flatshard can run",
                      made.stderr)
        self.assertFalse(os.path.exists(os.path.join(WORK, "never.yaml")))
        bad = run_from_torch("models", os.path.join(WORK, "never.yaml"))
        self.assertEqual(bad.returncode, 2)
        self.assertIn("expected MODULE:FACTORY", bad.stderr)
        with self.assertRaises(from_torch.UnsupportedModule) as caught:
            from_torch.model_spec(torch.nn.Sequential(torch.nn.Conv1d(2, 2, 3)))
        self.assertIn("0: torch.nn.modules.conv.Conv1d", str(caught.exception))
        # Dropout: the workers apply none, so only p=0 describes what they run.
        with self.assertRaises(from_torch.UnsupportedModule) as caught:
            from_torch.model_spec(torch.nn.Sequential(torch.nn.Linear(2, 2),
                                                      torch.nn.Dropout(0.1)), "drop")
        self.assertIn("1: Dropout(p=0.1)", str(caught.exception))
        from_torch.model_spec(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.0)))
        self.assertEqual(torch_modules.build({"root": {"type": "Dropout"}}).p, 0.0)

    def test_a_subclass_of_a_composite_must_keep_its_forward(self) -> None:
        class PostNormBlock(torch_modules.TransformerBlock):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.ln_2(x + self.mlp(self.ln_1(x + self.attn(x))))

        class NamedBlock(torch_modules.TransformerBlock):
            def __init__(self) -> None:  # its own construction, the same computation
                super().__init__(n_embd=8, num_heads=2)

        with self.assertRaises(from_torch.UnsupportedModule) as caught:
            from_torch.model_spec(torch.nn.Sequential(PostNormBlock(n_embd=8, num_heads=2)))
        self.assertIn("0: ", str(caught.exception))
        self.assertIn("PostNormBlock overrides forward of flatshard.torch_modules.TransformerBlock",
                      str(caught.exception))
        spec = from_torch.model_spec(torch.nn.Sequential(NamedBlock()))
        self.assertEqual(spec["root"]["children"][0]["type"], "TransformerBlock")

        # MLP's forward is nn.Sequential's: replacing it is caught too.
        class GatedMLP(torch_modules.MLP):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x * torch.sigmoid(super().forward(x))

        with self.assertRaises(from_torch.UnsupportedModule) as caught:
            from_torch.model_spec(torch.nn.Sequential(GatedMLP(torch.nn.Linear(8, 8))))
        self.assertIn("GatedMLP overrides forward of flatshard.torch_modules.MLP",
                      str(caught.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)

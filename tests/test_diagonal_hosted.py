"""A diagonal scale across the plugin host's wire (issue 59, item 1): a σ-provider and a
certifier in a plugin host answer and certify a scale per input dimension exactly as the
built-in ``anisotropic-fixed`` does in the harness's process, and a noise centre beside it;
a wrong shape is the σ-provider's contract error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.engine.centre import recorded_centre
from harness.engine.scale import recorded_scale
from harness.foundation.errors import ContractError
from harness.plugin.hosting.shared.messages import sigma_from
from harness.plugin.manager import PluginManager
from harness.store.storedrun import load_runs

HOSTED = '''
"""A σ-provider of a fixed diagonal scale and the anisotropic certifier, in a plugin host."""
from harness import CertifierSpec, MethodSpec, SigmaProviderSpec, hookimpl
from plugins.anisotropic.certifier import AnisotropicCertifier
from plugins.anisotropic.fixed_scale import FixedScale

IDRS_BENCH_CONTRACT = 4


class HostedCertifier(AnisotropicCertifier):
    pass


class Shifted(FixedScale):
    def centre(self, x):
        return x.new_full(x.shape, 0.125)


@hookimpl
def idrs_register_sigma_providers(register):
    register(SigmaProviderSpec("hosted-scale", lambda context, params: FixedScale(0.25, 2.0)))
    register(SigmaProviderSpec("hosted-shifted", lambda context, params: Shifted(0.25, 2.0)))


@hookimpl
def idrs_register_certifiers(register):
    register(CertifierSpec("hosted-anisotropic",
                           lambda context, params, provider: HostedCertifier()))


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("hosted-scale", "hosted-scale", "anisotropic", {}))
    register(MethodSpec("hosted-both", "hosted-scale", "hosted-anisotropic", {}))
    register(MethodSpec("hosted-shifted", "hosted-shifted", "hosted-anisotropic", {}))
'''


@pytest.mark.slow
def test_a_hosted_scale_and_certifier_certify_as_the_built_in(tmp_path, install_plugin, replay_run):
    install_plugin("idrs_test_scale", HOSTED)
    with PluginManager() as manager:
        db, run_id = replay_run(tmp_path, manager, ["anisotropic-fixed", "hosted-scale",
                                                    "hosted-both", "hosted-shifted"], n=400,
                                count=8)  # fmt: skip
    (run,) = load_runs(db, [run_id])
    rows: dict[str, list] = {}
    for c in run.certificates:
        rows.setdefault(c.method, []).append(c)
    local = rows["anisotropic-fixed"]
    assert any(c.region is not None for c in local)
    for name in ("hosted-scale", "hosted-both"):
        assert len(rows[name]) == len(local)
        for hosted, here in zip(rows[name], local, strict=True):
            assert np.array_equal(recorded_scale(hosted.draws), np.float32([0.25, 0.5]))
            assert (hosted.prediction, hosted.radius, hosted.region) == (
                here.prediction,
                here.radius,
                here.region,
            )
    # a centre crosses the wire (its own request) and the certificates record it
    shifted = rows["hosted-shifted"]
    assert len(shifted) == len(local)
    for c in shifted:
        assert np.array_equal(recorded_centre(c.draws), np.full(2, np.float32(0.125)))


def test_the_wire_takes_a_scale_of_the_inputs_shape_and_nothing_else():
    scale = torch.full((3, 2), 0.5)
    assert sigma_from(scale, 3, "p", (2,)) is scale
    assert sigma_from(torch.full((3, 1, 2), 0.5), 3, "p", (1, 2)).shape == (3, 1, 2)
    with pytest.raises(ContractError, match=r"shape \(3, 3\)"):
        sigma_from(torch.full((3, 3), 0.5), 3, "p", (2,))
    with pytest.raises(ContractError, match=r"returns shape \(3,\)$"):
        sigma_from(scale, 3, "p")  # no input shape given: one σ per input only
    with pytest.raises(Exception, match=r"entry 1"):
        sigma_from(torch.tensor([[0.5, 0.5], [0.5, -1.0], [0.5, 0.5]]), 3, "p", (2,))


@pytest.mark.gpu
def test_cuda_draws_a_scale_as_the_cpu_does():
    """On CUDA the fused kernel's variant that reads the scale per coordinate draws the
    CPU's samples up to float rounding, and a constant scale the scalar σ's samples (to
    float rounding: bit for bit is promised on a CPU only, harness.engine.scale)."""
    from harness.engine.noise import noise_key, noisy_batch

    g = torch.Generator().manual_seed(0)
    x, scale = torch.rand(4, 785, generator=g), torch.rand(4, 785, generator=g) + 0.5
    keys = torch.tensor([noise_key(3, 1, i) for i in range(4)])
    rows, samples = torch.arange(4).repeat_interleave(200), torch.arange(200).repeat(4)
    cpu = noisy_batch(x, scale, keys, rows, samples, torch.empty(800, 785))
    cuda = noisy_batch(x.cuda(), scale.cuda(), keys.cuda(), rows.cuda(), samples.cuda(),
                       torch.empty(800, 785, device="cuda"))  # fmt: skip
    assert torch.allclose(cuda.cpu(), cpu, rtol=1e-5, atol=1e-5)
    sigma = torch.tensor([0.1, 0.25, 0.5, 2.0], device="cuda")
    flat = sigma[:, None].expand(4, 785).contiguous()
    out = [noisy_batch(x.cuda(), s, keys.cuda(), rows.cuda(), samples.cuda(),
                       torch.empty(800, 785, device="cuda")) for s in (sigma, flat)]  # fmt: skip
    assert torch.allclose(out[0], out[1], rtol=1e-6, atol=1e-6)

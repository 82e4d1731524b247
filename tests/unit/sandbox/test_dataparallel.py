"""DataParallelSGD against torch.optim.SGD: the same parameters after the same steps, on a real
one-rank gloo group, and a state round-trip through a checkpoint's dict."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from gpufleet.sandbox.training.dataparallel import DataParallelSGD  # noqa: E402


@pytest.fixture(scope="module")
def group() -> Iterator[None]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _train(model: torch.nn.Module, opt: object, steps: range) -> None:
    g = torch.Generator().manual_seed(7)
    for _ in steps:
        x = torch.randn(4, 8, generator=g)
        opt.zero_grad()  # type: ignore[attr-defined]
        torch.nn.MSELoss()(model(x), x.sum(dim=1, keepdim=True)).backward()
        opt.step()  # type: ignore[attr-defined]


def test_matches_torch_optim_sgd_with_momentum(group: None) -> None:
    ref, ours = _model(3), _model(3)
    _train(ref, torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9), range(25))
    _train(ours, DataParallelSGD(list(ours.parameters()), lr=0.01, momentum=0.9), range(25))
    for a, b in zip(ref.parameters(), ours.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
    # and it did train: the parameters moved from where the seed put them
    assert not all(torch.equal(a, b) for a, b in zip(_model(3).parameters(), ours.parameters(), strict=True))


def test_state_round_trip_continues_the_same_run(group: None) -> None:
    whole, first = _model(5), _model(5)
    _train(whole, DataParallelSGD(list(whole.parameters()), lr=0.05, momentum=0.9), range(10))
    opt = DataParallelSGD(list(first.parameters()), lr=0.05, momentum=0.9)
    _train(first, opt, range(5))
    resumed = _model(0)
    resumed.load_state_dict(first.state_dict())
    opt2 = DataParallelSGD(list(resumed.parameters()), lr=0.0, momentum=0.0)
    opt2.load_state_dict(opt.state_dict())
    # the second half sees batches 5..9: replay the generator the same way _train does
    g = torch.Generator().manual_seed(7)
    for i in range(10):
        x = torch.randn(4, 8, generator=g)
        if i < 5:
            continue
        opt2.zero_grad()
        torch.nn.MSELoss()(resumed(x), x.sum(dim=1, keepdim=True)).backward()
        opt2.step()
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_checkpoint_of_another_model_is_refused(group: None) -> None:
    small = DataParallelSGD(list(torch.nn.Linear(2, 1).parameters()), lr=0.1, momentum=0.9)
    state = {"lr": 0.1, "momentum": 0.9, "momentum_buffers": [torch.zeros(3, 3)]}
    with pytest.raises(ValueError, match="do not match"):
        small.load_state_dict(state)

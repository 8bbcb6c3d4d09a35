"""The weight-sync worker extension of grpo_nb, plus what `bench/weight_sync.py` needs inside a real vLLM worker:
the receiving side of the raw-broadcast floor, and exact checksums of the worker's own parameters. The floor itself
(`raw_broadcast`) lives here so that the benchmark's learner and both receivers time it with the same code.

vLLM imports this class by name in its worker processes (`worker_extension_cls="vllm_bench_ext.BenchVllmExtension"`),
so `bench/` must be on their PYTHONPATH.
"""
import time
import torch
from grpo_nb.weight_sync import VllmWorkerExtension, module_checksums


def raw_broadcast(group, nbytes:int, iters:int) -> list[float]:
    "Time `iters` broadcasts of one `nbytes` buffer through a sync group (each after a 1-element broadcast that lines both sides up)."
    dev = group.device
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    buf, tick = torch.empty(nbytes, dtype=torch.uint8, device=dev), torch.zeros(1, device=dev)
    if group.rank == 0: buf.fill_(7)
    group.broadcast(buf).wait(); sync()   # warm-up (communicator, buffers)
    times = []
    for _ in range(iters):
        group.broadcast(tick).wait(); sync()
        t0 = time.perf_counter()
        group.broadcast(buf).wait(); sync()
        times.append(time.perf_counter() - t0)
    if group.rank != 0: assert int(buf[-1]) == 7
    return times


class BenchVllmExtension(VllmWorkerExtension):
    def grpo_floor(self, nbytes:int, iters:int) -> list[float]:
        "Receiver side of the raw-broadcast floor, through this worker's sync group."
        return raw_broadcast(self.grpo_group, nbytes, iters)

    def grpo_param_checksums(self) -> dict:
        "Exact checksum of every parameter as this worker holds it (vLLM's packed qkv_proj / gate_up_proj included)."
        return module_checksums(self.model_runner.get_model().named_parameters())

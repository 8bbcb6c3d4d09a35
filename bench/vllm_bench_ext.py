"""The weight-sync worker extension of grpo_nb, plus what `bench/weight_sync.py` needs inside a real vLLM worker:
the receiving side of the raw-broadcast floor, and exact checksums of the worker's own parameters.

vLLM imports this class by name in its worker processes (`worker_extension_cls="vllm_bench_ext.BenchVllmExtension"`),
so `bench/` must be on their PYTHONPATH.
"""
import time
import torch
from grpo_nb.weight_sync import VllmWorkerExtension, module_checksums


class BenchVllmExtension(VllmWorkerExtension):
    def grpo_floor(self, nbytes:int, iters:int) -> list[float]:
        "Receiver side of `iters` raw broadcasts of one `nbytes` buffer through the sync group (as `_raw_broadcast` in weight_sync.py)."
        g, dev = self.grpo_group, self.grpo_group.device
        sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
        buf, tick = torch.empty(nbytes, dtype=torch.uint8, device=dev), torch.zeros(1, device=dev)
        g.broadcast(buf).wait(); sync()
        times = []
        for _ in range(iters):
            g.broadcast(tick).wait(); sync()
            t0 = time.perf_counter()
            g.broadcast(buf).wait(); sync()
            times.append(time.perf_counter() - t0)
        assert int(buf[-1]) == 7
        return times

    def grpo_param_checksums(self) -> dict:
        "Exact checksum of every parameter as this worker holds it (vLLM's packed qkv_proj / gate_up_proj included)."
        return module_checksums(self.model_runner.get_model().named_parameters())

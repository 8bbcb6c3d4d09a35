"""Placement on real GPUs: the one-node layout "1 learner + 1 engine" on a machine with two GPUs. A probe actor in
each slot reports its node, CUDA_VISIBLE_DEVICES, Ray's GPU ids and the physical GPU behind its `cuda:0` (UUID, PCI bus id);
the learner and the engine must own distinct physical GPUs and see exactly one and TP GPUs. Writes
bench/results/placement_gpu.json.

GPU node (from the repo root; what the node needs: the guide page "Measured on GPUs", nbs/guides/gpu_results.ipynb):
    export PYTHONPATH=$PWD:/tmp/site RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 \
           NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    python3 bench/placement_gpu.py                      # about 30 s
Here (CPU, logical GPUs, no CUDA call):
    .venv/bin/python bench/placement_gpu.py --smoke     # writes /tmp/placement_gpu_smoke.json
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
from common import GPU_ENV  # shared by the bench scripts
sys.path.insert(0, ROOT)  # grpo_nb from this checkout, here and (through PYTHONPATH, below) in Ray's worker processes
ENV = GPU_ENV

def gpu_identity() -> dict:
    "Run inside a probe actor: the physical GPU behind cuda:0, by torch and by nvidia-smi."
    import torch
    p = torch.cuda.get_device_properties(0)
    uuid = "GPU-" + str(p.uuid)
    pci = (f"{getattr(p, 'pci_domain_id', 0):08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
           if hasattr(p, "pci_bus_id") and hasattr(p, "pci_device_id") else None)
    try: smi = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"], capture_output=True, text=True).stdout
    except OSError: smi = ""
    index = next((int(l.split(",")[0]) for l in smi.splitlines() if uuid in l), None)
    torch.ones(1, device="cuda")  # touch the device: a process that cannot use its GPU fails here
    return {"gpu_uuids": [uuid], "pci_bus_id": pci, "physical_index": index, "device_name": p.name,
            "visible_device_count": torch.cuda.device_count()}

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU run with 2 logical GPUs and no CUDA call")
    ap.add_argument("--out", help="JSON path (default: bench/results/placement_gpu.json, or /tmp/placement_gpu_smoke.json with --smoke)")
    a = ap.parse_args(argv)
    for k, v in ENV.items(): os.environ.setdefault(k, v)  # this script's own environment, inherited by Ray's processes
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    out = Path(a.out or ("/tmp/placement_gpu_smoke.json" if a.smoke else Path(__file__).parent / "results" / "placement_gpu.json"))
    t0 = time.monotonic()
    import ray
    from grpo_nb import placement as P
    ray_dir = tempfile.mkdtemp(prefix="rp")
    ray.init(address="local", num_cpus=4, num_gpus=2 if a.smoke else None, include_dashboard=False,  # our own instance, never
             object_store_memory=200 * 2**20, logging_level="ERROR", log_to_driver=False,        # a cluster found running
             _temp_dir=ray_dir)
    try:
        nodes = P.wait_for_nodes(1, 2, timeout_s=60, progress=print)
        lay = P.plan_layout(nodes=1, gpus_per_node=2, learners_per_node=[1], num_engines=1, tp=1)
        print(P.layout_table(lay), flush=True)
        groups = P.create_placement_groups(lay, timeout_s=60)
        try:
            reports = P.probe_placement(groups, extra=None if a.smoke else gpu_identity, env_vars=ENV)
        finally: groups.remove()
        print(P.reports_table(reports), flush=True)
        master = P.check_placement(lay, reports)  # raises PlacementError if a GPU is owned twice
        if not a.smoke: assert all(r["visible_device_count"] == len(r["gpu_ids"]) for r in reports), reports
        ids = [g for r in reports for g in (r.get("gpu_uuids") or [f"{r['node_id']}:{x}" for x in r["gpu_ids"]])]
        res = {"device": "cpu (logical GPUs)" if a.smoke else reports[0].get("device_name"), "smoke": a.smoke,
               "distinct_physical_gpus": len(ids) == len(set(ids)) == 2, "master_addr": master, "nodes": nodes,
               "layout": lay.to_dict(), "reports": reports, "ray_version": ray.__version__,
               "seconds": round(time.monotonic() - t0, 1)}
    finally: ray.shutdown(); shutil.rmtree(ray_dir, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str))
    print(f"distinct physical GPUs: {res['distinct_physical_gpus']}; {res['seconds']} s; wrote {out}")
    return 0 if res["distinct_physical_gpus"] else 1

if __name__ == "__main__":
    sys.exit(main())

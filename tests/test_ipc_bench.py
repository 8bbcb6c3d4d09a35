"""bench/ipc_sync.py on CPU: the colocated sync's transport between two processes, both ways of sharing, every byte checked."""
import json, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_run_shares_two_buffers_a_sync_and_delivers_every_bucket(tmp_path):
    out = tmp_path / "ipc.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "ipc_sync.py"), "--smoke", "--syncs", "3", "--out", str(out)], check=True, timeout=300)
    r = json.loads(out.read_text())["records"][0]
    assert r["device"] == "cpu" and r["timed_syncs"] == 2 and r["bytes_per_sync"] == 4 << 20
    assert r["per-sync"]["received_exactly"] and r["per-bucket"]["received_exactly"]
    assert (r["per-sync"]["handles_per_sync"], r["per-bucket"]["handles_per_sync"]) == (2, 4)
    for mode in ("per-sync", "per-bucket"):
        assert len(r[mode]["sync_s_all"]) == 3 and r[mode]["sync_mean_s"] > 0 and r[mode]["sync_p90_s"] >= r[mode]["sync_median_s"] > 0

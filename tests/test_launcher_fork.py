"""The local launcher's forked workers survive a driver that has already run multi-threaded torch ops (libgomp is
not fork-safe: without one thread per worker the child's first parallel op waits forever), and run numpy's BLAS on
one thread too (two workers' spinning BLAS threads on two cores slowed an FID's eigendecomposition to minutes)."""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import torch
    from types import SimpleNamespace
    from attention_zoo.experiments.launchers import LocalLauncher

    def work(unit):
        from threadpoolctl import threadpool_info

        x = torch.randn(2000, 2000)
        idx = torch.randint(0, 2000, (2000,))
        blas = max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
        return [[{"value": float(x[idx].sum()), "threads": torch.get_num_threads(), "blas": blas}] for _ in unit]

    if __name__ == "__main__":
        import numpy as np
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(2)
        threadpool_limits(2)  # numpy's BLAS in the driver: two threads, spun up by a product
        np.linalg.eigvals(np.random.default_rng(0).standard_normal((300, 300)))
        x = torch.randn(2000, 2000)
        x[torch.randint(0, 2000, (2000,))].sum()  # the driver enters an OpenMP parallel region before forking
        plan = SimpleNamespace(workers=2, work=work, worker_init=None)
        out = list(LocalLauncher().run([[{"c": 0}], [{"c": 1}]], plan))
        assert [msg for _, _, msg in out] == ["", ""], out
        print(sorted(r[0][0]["threads"] for _, r, _ in out), sorted(r[0][0]["blas"] for _, r, _ in out))
""")


@pytest.mark.skipif(sys.platform != "linux", reason="the launcher forks on Linux only")
def test_forked_workers_do_not_hang_after_the_driver_used_openmp(tmp_path):
    (tmp_path / "drive.py").write_text(SCRIPT)
    try:
        proc = subprocess.run([sys.executable, str(tmp_path / "drive.py")], capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("a forked worker hung in its first multi-threaded op")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[1, 1] [1, 1]"  # torch and numpy's BLAS: one thread per worker

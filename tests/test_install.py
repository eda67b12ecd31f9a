"""`pip install .` into a fresh venv, then the `specdec` console script from another directory."""
from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.install  # deselected by the quick loop (-m "not slow"); CI runs it

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd, cwd, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, a directory outside the checkout) after `pip install .` into a fresh venv.

    The venv sees this environment's packages (torch, transformers, pip, setuptools) through a .pth file,
    so the install downloads nothing; specdec itself goes into the venv's own site-packages, which comes
    first on sys.path.
    """
    tmp = tmp_path_factory.mktemp("install")
    venv = tmp / "venv"
    r = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp)
    assert r.returncode == 0, r.stderr
    py = venv / "bin" / "python"
    purelib = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp)
    outer = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    (Path(purelib.stdout.strip()) / "_outer_env.pth").write_text("\n".join(dict.fromkeys(outer)) + "\n")
    r = _run([str(py), "-m", "pip", "install", "-q", "--no-build-isolation", str(ROOT)], tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return venv, elsewhere


def test_pip_install_gives_the_package_its_assets_and_the_commands(installed):
    venv, elsewhere = installed
    py = str(venv / "bin" / "python")
    where = _run([py, "-c", "import specdec, pathlib; p = pathlib.Path(specdec.__file__).parent; "
                            "print(p); print((p / 'assets' / 'model' / 'model.safetensors').is_file())"], elsewhere)
    assert str(venv) in where.stdout and where.stdout.split()[-1] == "True", where.stdout + where.stderr
    r = _run([str(venv / "bin" / "specdec"), "--help"], elsewhere)
    assert r.returncode == 0 and "generate" in r.stdout and "train" in r.stdout, r.stderr
    r = _run([py, "-m", "specdec.train", "heads", "--help"], elsewhere)
    assert r.returncode == 0 and "--prompts" in r.stdout, r.stderr
    r = _run([str(venv / "bin" / "specdec"), "generate", "--model", str(ROOT / "assets" / "model"), "--heads",
              str(ROOT / "assets" / "heads"), "--prompt", "def f(x):", "--max-new-tokens", "8"], elsewhere)
    assert r.returncode == 0 and r.stdout.startswith("def f(x):"), r.stderr


def test_installed_specdec_generate_uses_the_embedded_model_from_elsewhere(installed):
    venv, elsewhere = installed
    r = _run([str(venv / "bin" / "specdec"), "generate", "--prompt", "def f(x):", "--max-new-tokens", "8"],
             elsewhere)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("def f(x):") and len(r.stdout) > len("def f(x):")
    assert "mean accepted length" in r.stderr


def test_the_library_and_serve_need_no_gradio(installed):
    """gradio and plotly are the `app` extra's; the library, the CLI and `serve` import neither."""
    venv, elsewhere = installed
    py = str(venv / "bin" / "python")
    r = _run([py, "-c", "import importlib.metadata as m; print(m.requires('specdec'))"], elsewhere)
    requires = eval(r.stdout)  # a printed list of requirement strings
    core = [q for q in requires if "extra ==" not in q]
    assert not any(q.startswith(("gradio", "plotly")) for q in core), core
    assert any(q.startswith("gradio") and 'extra == "app"' in q for q in requires), requires
    assert "torch>=2.8" in core and not any(q.startswith("torch") and "<" in q for q in core)
    r = _run([py, "-c", "import sys, specdec, specdec.serve, specdec.__main__; "
                        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('gradio', 'plotly')))"], elsewhere)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def _serving(cmd: list[str], cwd: Path, url: str, timeout: float = 120.0) -> str:
    """Start `cmd`, wait until `url` answers 200, return its body, and stop the process."""
    import httpx

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            try:
                r = httpx.get(url, timeout=2)
                if r.status_code == 200:
                    return r.text
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{url} did not answer within {timeout} s")
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_installed_serve_and_app_run_from_elsewhere(installed):
    from conftest import free_port

    venv, elsewhere = installed
    port = free_port()
    body = _serving([str(venv / "bin" / "specdec"), "serve", "--port", str(port)], elsewhere,
                    f"http://127.0.0.1:{port}/v1/models")
    assert '"embedded"' in body
    port = free_port()
    body = _serving([str(venv / "bin" / "specdec"), "app", "--port", str(port)], elsewhere,
                    f"http://127.0.0.1:{port}/")
    assert "specdec" in body

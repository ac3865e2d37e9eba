"""The built wheel, its Keras-backend hook with and without TensorFlow installed, and the issue's
example program run as written (keras imported first) where TensorFlow is absent.

Where TensorFlow is absent, the wheel is really installed (``pip install``, not editable) into a
fresh virtual environment; the hook's rules are in ``_stratax_keras_backend.py``."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
HOOK = ROOT / "stratax-keras-backend.pth"
HOOK_MODULE = ROOT / "_stratax_keras_backend.py"  # what HOOK imports
HAVE_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None

# Each program first adds the site directories given on its command line, in order, as an
# installed wheel's site-packages does at start-up (its .pth files run).
ADD_SITES = "import site, sys\nfor d in sys.argv[1:]: site.addsitedir(d)\n"

PROGRAM = textwrap.dedent("""
    import keras
    import stratax as sx

    from stratax.datasets import load_digits
    (x_train, y_train), (x_test, y_test) = load_digits()

    strategy = sx.MirroredStrategy()          # all local devices
    print(strategy.num_replicas_in_sync)
    with strategy.scope():
        model = keras.Sequential([
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    model.fit(x_train, y_train, epochs=5, batch_size=64, verbose=0)   # 64 = global batch
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    print("backend", keras.backend.backend(), "accuracy", accuracy)
""")

WITH_TENSORFLOW = ADD_SITES + textwrap.dedent("""
    import os
    print("KERAS_BACKEND", os.environ.get("KERAS_BACKEND"))
    import keras
    import tensorflow as tf
    print("backend", keras.backend.backend())
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    print("tf.function", tuple(tf.function(model)(tf.ones((1, 3))).shape))
    try:
        import stratax
    except RuntimeError as error:
        print("error", error)
""")

# Which backend Keras picked, and whether KERAS_BACKEND is in the environment before and after
# `import keras` (what a child process would inherit).
KERAS_BACKEND_CHOSEN = textwrap.dedent("""
    import importlib.util, os
    print("tensorflow", importlib.util.find_spec("tensorflow"))
    print("before", os.environ.get("KERAS_BACKEND"))
    try:
        import keras
        backend = keras.backend.backend()
    except ModuleNotFoundError as error:  # the backend Keras picked needs a package not here
        backend = f"{error.name} (not installed)"
    print("backend", backend)
    print("after", os.environ.get("KERAS_BACKEND"))
""")


def _environment(keras_home: Path, *, checkout: bool = True) -> dict[str, str]:
    """The children's environment: no Keras backend chosen (the conftest sets one), Keras'
    settings in ``keras_home`` (never the user's ``~/.keras``), 2 CPU devices. With
    ``checkout``, this checkout is importable (an editable install's hook is not in every test's
    site directories); without it, it is kept off the path, so an installed stratax runs."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KERAS_BACKEND", "KERAS_HOME", "STRATAX_CPU_DEVICES")}
    env.update(STRATAX_CPU_DEVICES="2", KERAS_HOME=str(keras_home))
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
             if p and Path(p).resolve() != ROOT.resolve()]
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT)] if checkout else paths)
    return env


def _hook_site(directory: Path) -> Path:
    """A site directory holding only this checkout's hook, as installing the wheel adds it."""
    directory.mkdir()
    for path in (HOOK, HOOK_MODULE):
        shutil.copy(path, directory / path.name)
    return directory


@pytest.fixture(scope="module")
def site_without_tensorflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This environment's site-packages without TensorFlow: links to every other entry.

    TensorFlow is really installed here, so an environment without it is made by path control,
    not by a stub: a child started with ``python -S`` (no site-packages on its path) that adds
    this directory finds keras, jax and the rest, and no ``tensorflow`` anywhere on its path.
    Other packages' ``.pth`` hooks and the installed stratax (an editable install's finder) are
    left out too, so the checkout's stratax and hook are the ones that run.
    """
    farm = tmp_path_factory.mktemp("site-without-tensorflow")
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower()
        if (name.startswith(("tensorflow", "stratax", "_stratax", "__editable__"))
                or name.endswith(".pth")):
            continue
        (farm / entry.name).symlink_to(entry)
    yield farm
    shutil.rmtree(farm)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """stratax's wheel, built from this checkout as ``pip install .`` builds it."""
    directory = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(directory)],
        capture_output=True, text=True, timeout=360)
    assert built.returncode == 0, built.stderr[-2000:]
    (path,) = directory.glob("stratax-*.whl")
    return path


@pytest.fixture(scope="module")
def installed_without_tensorflow(wheel: Path, site_without_tensorflow: Path,
                                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The Python of a fresh virtual environment where the wheel is installed, not editable.

    The venv has no system site-packages and holds stratax alone (``--no-deps``, nothing
    downloaded); stratax's requirements come from ``site_without_tensorflow``, which a
    path-only ``.pth`` file puts on the venv's path. So no TensorFlow, and the hook that runs is
    the installed one.
    """
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    no_path = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing installed yet
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=120, env=no_path)
    assert installed.returncode == 0, installed.stderr[-2000:]
    site_packages = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert (Path(site_packages) / HOOK.name).read_bytes() == HOOK.read_bytes()
    (Path(site_packages) / "zz-without-tensorflow.pth").write_text(f"{site_without_tensorflow}\n")
    yield python
    shutil.rmtree(venv)


def _run_installed(python: Path, program: str, env: dict[str, str], cwd: Path,
                   timeout: float = 120) -> list[str]:
    """Runs ``program`` in the venv from ``cwd`` (not the checkout: ``python -c`` puts the
    working directory first on the path); returns its output lines."""
    done = subprocess.run([str(python), "-c", program], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


@pytest.mark.skipif(not HAVE_TENSORFLOW, reason="TensorFlow is not installed here")
def test_with_tensorflow_installed_the_hook_leaves_keras_on_tensorflow(tmp_path):
    """The issue's case: stratax installed next to TensorFlow. A program that never imports
    stratax keeps TensorFlow's Keras (``@tf.function`` over a ``tf.keras`` model works), and
    ``import stratax`` after Keras started on TensorFlow is an error naming both fixes."""
    site_dir = _hook_site(tmp_path / "site")
    done = subprocess.run([sys.executable, "-c", WITH_TENSORFLOW, str(site_dir)],
                          capture_output=True, text=True, timeout=120,
                          env=_environment(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[:3] == ["KERAS_BACKEND None", "backend tensorflow", "tf.function (1, 2)"], \
        done.stdout
    assert lines[3].startswith("error Keras was imported with the 'tensorflow' backend before "
                               "stratax"), done.stdout
    assert "put `import stratax` before `import keras` and `import tensorflow`" in lines[3]
    assert "or set `KERAS_BACKEND=jax`" in lines[3]


@pytest.fixture
def hook_module() -> Iterator[types.ModuleType]:
    """This checkout's ``_stratax_keras_backend``, loaded apart; its finder is taken out after."""
    spec = importlib.util.spec_from_file_location("_stratax_keras_backend_under_test",
                                                  HOOK_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.meta_path.remove(module._KerasFinder)


@pytest.mark.parametrize(("keras_backend", "keras_json", "chosen"), [
    (None, '{"backend": "torch"}', True),
    ("", '{"backend": "torch"}', True),  # Keras ignores an empty KERAS_BACKEND
    ("", None, False),
    ("numpy", None, True),
    (None, None, False),
    (None, '{"floatx": "float64"}', False),
    (None, '{"backend": ""}', False),
    (None, '{"backend": "tensorflow"}', False),  # what Keras itself writes on first import
    (None, "not json", False),  # Keras reads it as {}
    (None, '["torch"]', False),
])
def test_hook_reads_the_backend_choice_as_keras_does(hook_module, monkeypatch, tmp_path,
                                                     keras_backend, keras_json, chosen):
    """The edge cases of reading ``KERAS_BACKEND`` and ``keras.json`` (Keras 3's
    ``keras/src/backend/config.py``), beyond the installed cases below."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    if keras_backend is None:
        monkeypatch.delenv("KERAS_BACKEND")
    else:
        monkeypatch.setenv("KERAS_BACKEND", keras_backend)
    if keras_json is not None:
        (tmp_path / "keras.json").write_text(keras_json)
    assert hook_module._user_chose_a_backend() is chosen


NOT_INSTALLED = "(not installed)"


@pytest.mark.timeout(400)  # the first test to use the venv builds the wheel
@pytest.mark.parametrize("where", ["KERAS_HOME", "HOME"])
def test_installed_hook_leaves_the_backend_keras_json_names(installed_without_tensorflow,
                                                           tmp_path, where):
    """The issue's case: no TensorFlow, ``keras.json`` says torch (in ``$KERAS_HOME``, or in
    ``~/.keras`` where ``KERAS_HOME`` is unset): Keras goes for torch, as it would without
    stratax, and ``KERAS_BACKEND`` is never set."""
    env = _environment(tmp_path / "keras-home", checkout=False)
    if where == "HOME":
        del env["KERAS_HOME"]
        env["HOME"] = str(tmp_path)
        keras_dir = tmp_path / ".keras"
    else:
        keras_dir = tmp_path / "keras-home"
    keras_dir.mkdir()
    (keras_dir / "keras.json").write_text('{"backend": "torch"}')
    lines = _run_installed(installed_without_tensorflow, KERAS_BACKEND_CHOSEN, env, tmp_path)
    assert lines[:2] == ["tensorflow None", "before None"], lines
    assert lines[2] in ("backend torch", f"backend torch {NOT_INSTALLED}"), lines
    assert lines[3] == "after None", lines


@pytest.mark.timeout(400)
def test_installed_hook_makes_jax_the_default_only_while_keras_imports(
        installed_without_tensorflow, tmp_path):
    """No TensorFlow and no backend named: ``keras.json`` naming none, then none at all, then
    the one Keras writes on its first import (it says ``"tensorflow"`` whatever backend ran,
    and TensorFlow is absent): Keras runs on JAX each time, and ``KERAS_BACKEND`` is in the
    environment only while ``keras`` imports (neither before nor after: no child inherits it)."""
    keras_home = tmp_path / "keras-home"
    keras_home.mkdir()
    env = _environment(keras_home, checkout=False)
    on_jax = ["tensorflow None", "before None", "backend jax", "after None"]
    (keras_home / "keras.json").write_text('{"floatx": "float32"}')
    assert _run_installed(installed_without_tensorflow, KERAS_BACKEND_CHOSEN, env,
                          tmp_path) == on_jax
    (keras_home / "keras.json").unlink()
    assert _run_installed(installed_without_tensorflow, KERAS_BACKEND_CHOSEN, env,
                          tmp_path) == on_jax
    assert json.loads((keras_home / "keras.json").read_text())["backend"] == "tensorflow"
    assert _run_installed(installed_without_tensorflow, KERAS_BACKEND_CHOSEN, env,
                          tmp_path) == on_jax


@pytest.mark.timeout(400)
def test_installed_hook_leaves_keras_backend_as_set(installed_without_tensorflow, tmp_path):
    """``KERAS_BACKEND`` set (here to Keras' own numpy backend, over a ``keras.json`` naming
    torch): Keras uses it, and the hook leaves it as it was."""
    keras_home = tmp_path / "keras-home"
    keras_home.mkdir()
    (keras_home / "keras.json").write_text('{"backend": "torch"}')
    env = _environment(keras_home, checkout=False)
    env["KERAS_BACKEND"] = "numpy"
    assert _run_installed(installed_without_tensorflow, KERAS_BACKEND_CHOSEN, env, tmp_path) \
        == ["tensorflow None", "before numpy", "backend numpy", "after numpy"]


@pytest.mark.timeout(400)
def test_wheel_ships_the_backend_hook_and_the_guide_program_runs_keras_first(
        wheel, installed_without_tensorflow, tmp_path):
    """The guide program as written (``import keras`` before ``import stratax``), run where the
    wheel is installed and TensorFlow is not."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "stratax/_src/datasets/digits.npz" in names
    assert "stratax/_src/observe/static/uPlot.iife.min.js" in names  # the dashboard, offline
    assert "stratax/py.typed" in names  # type checkers read the package's hints (PEP 561)
    assert {HOOK.name, HOOK_MODULE.name} <= set(names)  # at the root of site-packages
    lines = _run_installed(installed_without_tensorflow, PROGRAM,
                           _environment(tmp_path, checkout=False), tmp_path, timeout=300)
    assert lines[0] == "2"
    backend, accuracy = lines[1].split()[1], float(lines[1].split()[3])
    # The program is unseeded (as written): 12 runs gave 0.886-0.905.
    assert backend == "jax" and accuracy >= 0.87


def test_ci_runs_exactly_the_readme_test_command():
    """`.ci/run` and the README's install-and-test command are one command, lint included."""
    readme = (ROOT / "README.md").read_text()
    ci_lines = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    command = ci_lines[-1]
    assert command.startswith('python -m pip install -q -e ".[test]" -e ./benchmarks && ')
    assert "python -m ruff check ." in command and "python -m pytest" in command
    assert command.endswith("bash .ci/other_end_of_range.sh")  # the other end of the range
    assert f"```bash\n{command}\n```" in readme


def test_readme_stays_a_short_user_page_whose_links_resolve():
    """The README is for users: at most 12 KB, no dated measurements (they live in
    docs/design/ and benchmarks/), and every relative link of it, of the docs and of the
    benchmarks' pages (their method, their current summaries, their raw results and their
    dated log) resolves."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024, len(readme.encode())
    assert not re.search(r"\d\d:\d\d UTC|20\d\d-\d\d-\d\d", readme)
    broken = []
    benchmarks = ROOT / "benchmarks"
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "ARCHITECTURE.md",
             *(ROOT / "docs").rglob("*.md"), benchmarks / "README.md", benchmarks / "HISTORY.md",
             *(benchmarks / "summaries").glob("*.md"), *(benchmarks / "results").glob("*.md")]
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#")[0]
            if path and not path.startswith(("http://", "https://")) \
                    and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken

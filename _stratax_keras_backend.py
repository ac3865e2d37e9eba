"""JAX as Keras' backend where its user chose none and TensorFlow is absent, nowhere else.

stratax's wheel puts this module at the root of site-packages with ``stratax-keras-backend.pth``,
whose one line imports it at every interpreter start in that environment. Why: TensorFlow's
guides import ``keras`` first, and a program ported by changing two import lines does too, so
Keras picks its backend before ``import stratax`` could. Where TensorFlow is not installed,
Keras' own default (``"tensorflow"``) cannot run anyway, so JAX can be the default there.

A default must not override a choice. When ``keras`` is first imported, and only then (the
moment Keras itself reads its settings, so a program's own ``os.environ`` edits count), nothing
happens if any of these holds:

- TensorFlow is importable (Keras' own default runs; ``tf.keras`` programs keep it);
- ``KERAS_BACKEND`` is set and not empty (Keras reads it before ``keras.json``);
- ``keras.json`` names a backend other than ``"tensorflow"``. It is found as Keras finds it
  (``keras/src/backend/config.py``): ``$KERAS_HOME/keras.json``, else ``~/.keras/keras.json``,
  else ``/tmp/.keras/keras.json`` where the home directory is not writable. ``"tensorflow"``
  is no choice here: Keras writes it into a new ``keras.json`` on its first import whatever
  backend runs, and it cannot run without TensorFlow.

Otherwise Keras is imported with ``KERAS_BACKEND=jax`` in ``os.environ``, which is removed again
as soon as the import ends. Keras reads its backend only from that variable or ``keras.json``,
only while ``keras`` is first imported, so this is the narrowest way it can see one: programs that
never import Keras see nothing, and child processes inherit nothing (``import stratax`` itself
sets the variable for good, ``stratax._src.startup``).

It stays import-light, as it runs at every start: ``os`` and ``sys`` are loaded already, and
``json`` is imported only where a ``keras.json`` exists, when ``keras`` is imported. It cannot
import stratax (whose ``__init__`` prepares the environment), so the variable names are written
here rather than taken from ``stratax._src.core.env``.
"""

import os
import sys

_KERAS_BACKEND = "KERAS_BACKEND"
_KERAS_HOME = "KERAS_HOME"


def _user_chose_a_backend() -> bool:
    """Whether ``KERAS_BACKEND`` or ``keras.json`` names a backend, read as Keras reads them."""
    if os.environ.get(_KERAS_BACKEND):
        return True
    if _KERAS_HOME in os.environ:
        keras_dir = os.environ[_KERAS_HOME]
    else:
        home = os.path.expanduser("~")
        keras_dir = os.path.join(home if os.access(home, os.W_OK) else "/tmp", ".keras")
    path = os.path.expanduser(os.path.join(keras_dir, "keras.json"))
    if not os.path.exists(path):
        return False
    import json

    try:
        with open(path) as file:
            config = json.load(file)
    except (OSError, ValueError):  # Keras reads an unparsable one as {}, fails on an unreadable one
        return False
    backend = config.get("backend") if isinstance(config, dict) else None
    return bool(backend) and backend != "tensorflow"


def _exec_on_jax(loader, module) -> None:
    """Runs ``keras/__init__.py`` with ``KERAS_BACKEND=jax``, then restores the environment."""
    del loader.exec_module  # the loader's own method again, for any later import
    previous = os.environ.get(_KERAS_BACKEND)
    os.environ[_KERAS_BACKEND] = "jax"
    try:
        loader.exec_module(module)
    finally:
        if previous is None:
            os.environ.pop(_KERAS_BACKEND, None)
        else:
            os.environ[_KERAS_BACKEND] = previous


class _KerasFinder:
    """First on ``sys.meta_path``: on ``import keras``, wraps Keras' loader if no choice was made.

    Python asks it for every module not imported yet and it answers ``None`` at once unless the
    name is ``keras``; once Keras is in ``sys.modules`` it is not asked about Keras again (unless
    ``keras.config.set_backend`` re-imports Keras, with ``KERAS_BACKEND`` set: a choice).
    """

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "keras":
            return None
        finders = [f for f in sys.meta_path if f is not cls and hasattr(f, "find_spec")]
        if any(f.find_spec("tensorflow", None) for f in finders) or _user_chose_a_backend():
            return None
        spec = next(filter(None, (f.find_spec(name, path, target) for f in finders)), None)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        loader.exec_module = lambda module: _exec_on_jax(loader, module)
        return spec


if _KerasFinder not in sys.meta_path:
    sys.meta_path.insert(0, _KerasFinder)

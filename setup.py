"""Installs ``stratax-keras-backend.pth`` beside the package (the rest is in pyproject.toml).

The ``.pth`` file makes JAX Keras' default backend in this environment only where TensorFlow
is not installed and ``KERAS_BACKEND`` is unset: there Keras' own default (TensorFlow) could not
run anyway, and TensorFlow programs ported by changing two import lines run even when they
import ``keras`` before ``stratax``, as TensorFlow's guides do. Where TensorFlow is installed the
hook does nothing, so ``tf.keras`` and every Keras program that never imports stratax keep
TensorFlow; a program that uses stratax there imports it before ``keras`` and ``tensorflow``
(or sets ``KERAS_BACKEND=jax``), else ``import stratax`` says so (``stratax._src.startup``).
The hook asks ``sys.meta_path``'s finders directly rather than ``importlib.util.find_spec``,
which a bare virtual environment has not imported yet at start-up (~3 ms more per start).
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "stratax-keras-backend.pth"


class BuildWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(os.path.join(os.path.dirname(__file__) or ".", PTH),
                       os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildWithPth})

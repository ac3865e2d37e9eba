"""Installs ``stratax-keras-backend.pth`` beside the package (the rest is in pyproject.toml).

The ``.pth`` file's one line imports ``_stratax_keras_backend`` (a top-level module, listed in
pyproject.toml) at every interpreter start in this environment. That module makes JAX Keras'
backend only where the user chose none (no ``KERAS_BACKEND``, no ``keras.json`` naming one)
and TensorFlow, Keras' own default, is not installed, so that TensorFlow programs ported by
changing two import lines run even when they import ``keras`` before ``stratax``, as
TensorFlow's guides do. It sets ``KERAS_BACKEND`` only while ``keras`` is first imported, so
programs that never import Keras, and child processes, see no change; its docstring has the
rules. Elsewhere a program that uses stratax imports it before ``keras`` and ``tensorflow`` (or
sets ``KERAS_BACKEND=jax``), else ``import stratax`` says so (``stratax._src.startup``).
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

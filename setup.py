"""Installs ``stratax-keras-backend.pth`` beside the package (the rest is in pyproject.toml).

The ``.pth`` file makes JAX Keras' default backend in this environment (only when
``KERAS_BACKEND`` is unset), so TensorFlow programs ported by changing two import lines run
even when they import ``keras`` before ``stratax``, as TensorFlow's guides do.
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

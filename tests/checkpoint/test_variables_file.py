"""The variables file (``checkpoint/variables_file.py``) that ``sx.checkpoint.save_variables``
writes: entries named by variable path, checked by name and shape on load, older versions
still read."""

import json

import numpy as np
import pytest

from stratax._src.checkpoint.files import write_npz


def test_checkpoint_files_check_names_shapes_and_format(tmp_path):
    from stratax._src.keras.checkpoint_variables import load_variables, save_variables

    class Var:
        def __init__(self, path, value):
            self.path, self.value = path, np.asarray(value, np.float32)
            self.shape = self.value.shape

        def numpy(self):
            return self.value

        def assign(self, value):
            self.value = np.array(value)

    save_variables(tmp_path / "a.npz", [Var("k", [[1, 2], [3, 4]]), Var("b", [5])])
    target = Var("k", np.zeros((2, 2)))
    assert load_variables(tmp_path / "a.npz", [target]) == ["k"]
    np.testing.assert_array_equal(target.value, [[1, 2], [3, 4]])
    with pytest.raises(ValueError, match=r"'k' with shape \(2, 2\), the variable 'k' has \(3,\)"):
        load_variables(tmp_path / "a.npz", [Var("k", np.zeros(3))])
    with pytest.raises(ValueError, match="no variable 'x'; it has \\['k', 'b'\\]"):
        load_variables(tmp_path / "a.npz", [Var("x", np.zeros(3))])
    # Keras' automatic top-level model name is not part of an entry's name, and either side
    # may have it (a model built in code has it, the same from load_model not).
    save_variables(tmp_path / "m.npz", [Var("sequential_2/dense/kernel", [1.0, 2.0]),
                                        Var("net/dense/kernel", [3.0])])
    with np.load(tmp_path / "m.npz") as data:
        names = [e["name"] for e in json.loads(data["header"].tobytes())["variables"]]
        assert data["value/net/dense/kernel"].tolist() == [3.0]   # arrays named too
        assert sorted(data.files) == ["header", "value/dense/kernel", "value/net/dense/kernel"]
    assert names == ["dense/kernel", "net/dense/kernel"]
    loaded = [Var("dense/kernel", np.zeros(2)), Var("sequential/net/dense/kernel", np.zeros(1))]
    assert load_variables(tmp_path / "m.npz", loaded) == ["dense/kernel",
                                                          "sequential/net/dense/kernel"]
    assert loaded[0].value.tolist() == [1.0, 2.0] and loaded[1].value.tolist() == [3.0]
    save_variables(tmp_path / "two.npz", [Var("sequential/dense/kernel", [1.0]),
                                          Var("sequential_1/dense/kernel", [2.0])])
    with pytest.raises(ValueError, match="several entries for variable 'dense/kernel'"):
        load_variables(tmp_path / "two.npz", [Var("dense/kernel", [0.0])])
    # A file of version 1 (arrays numbered by entry) still loads.
    write_npz(tmp_path / "v1.npz", {"format": "stratax-variables", "version": 1, "variables": [
        {"name": "k", "shape": [2], "dtype": "float32", "optimizer": None, "slots": [],
         "iterations": [[0, 2, 0]]}]}, {"value/0": np.array([7.0, 8.0], np.float32)})
    old = Var("k", np.zeros(2))
    assert load_variables(tmp_path / "v1.npz", [old]) == ["k"] and old.value.tolist() == [7, 8]
    with pytest.raises(ValueError, match=r"must end with '\.npz'"):
        save_variables(tmp_path / "a.h5", [target])
    np.savez(tmp_path / "other.npz", header=np.frombuffer(json.dumps({"x": 1}).encode(), np.uint8))
    with pytest.raises(ValueError, match="not a stratax variables checkpoint"):
        load_variables(tmp_path / "other.npz", [target])

"""cstorch.amp's half dtype and mixed-precision switch are process-wide; tests/conftest.py
gives each test back what it found, as a fresh process of the reference would. The two
tests run in this order: the second fails if the first's setting leaks into it."""
import cerebras.pytorch as cstorch


def test_a_test_switches_mixed_precision_on():
    cstorch.amp.set_half_dtype("bfloat16")
    assert cstorch.amp.mixed_precision()


def test_the_next_test_finds_the_settings_of_a_fresh_process():
    assert not cstorch.amp.mixed_precision()
    assert cstorch.amp.get_half_dtype_str() == "float16"

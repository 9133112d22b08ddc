import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Scripts run by tests record no behaviour fingerprint (seconds each); tests/test_fingerprints.py turns it back on.
os.environ.setdefault("ATTENTION_ZOO_FINGERPRINT", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

import attention_zoo  # noqa: E402,F401  (applies the torchvision shim before any test imports torchvision)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield

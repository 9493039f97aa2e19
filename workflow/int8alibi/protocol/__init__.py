"""The protocol as data: pinned files, prediction matrices, amendments and the fail-closed gate.

Appending an amendment (``tools.amend``, the ``int8alibi amend`` command) reads stage manifests
to vouch for data pins, so it sits in the tools layer, above ``provenance``.
"""

from .chain import Amendment
from .gate import GateReport, current_pins, gate, pinned_data_digest, verify_data_pin
from .history import History
from .load import Protocol, load
from .pins import PROTOCOL_FILES, STAGE_FILES, data_digest

__all__ = [
    "Amendment",
    "GateReport",
    "History",
    "PROTOCOL_FILES",
    "Protocol",
    "STAGE_FILES",
    "current_pins",
    "data_digest",
    "gate",
    "load",
    "pinned_data_digest",
    "verify_data_pin",
]

"""Errors that stop a run. Every message names the file (or object) and the reason."""


class Int8AlibiError(Exception):
    """Base class: anything that does not verify."""


class ProtocolError(Int8AlibiError):
    """The protocol or an amendment does not verify."""


class ManifestError(Int8AlibiError):
    """A manifest or an output named by it does not verify."""


class InputError(Int8AlibiError):
    """An input file (config, checkpoint, operands, corpus) is malformed."""


class GateError(Int8AlibiError):
    """A pre-registered gate failed (e.g. requantization not byte-identical)."""


class DiskFullError(Int8AlibiError):
    """A write failed because the filesystem is full (ENOSPC); nothing partial was left behind."""


class ConfigScopeError(Int8AlibiError):
    """A stage read a config key that its rule does not digest (``int8alibi.planning.stage_needs``)."""

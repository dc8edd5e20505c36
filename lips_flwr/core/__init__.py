"""The LIPS algorithm in plain numpy, with no ``flwr`` import.

Small functions over ordered ``name -> ndarray`` mappings
(:mod:`.schedule`, :mod:`.scores`, :mod:`.layers`, :mod:`.masking`,
:mod:`.inertia`, :mod:`.trigger`, :mod:`.checks`, :mod:`.client_masking`) and one object,
:class:`~lips_flwr.core.lips.LIPSCore`, that holds the settings and answers a
whole round in one call.
"""

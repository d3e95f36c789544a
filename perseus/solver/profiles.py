"""The solver's view of a profile: the options that stay worth running once blocking power is
counted (:func:`effective_options`).

The profile's values live on the ground floor (:mod:`perseus.core.profiles`: :class:`Profile`,
:class:`Option`, :class:`ProfileRow`, :func:`profile_from_rows`), its files in
:mod:`perseus.formats.profiles` (:func:`load_profile`, the CSV and JSON forms); both are named
here too, for the imports that knew them here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from perseus.core.pipeline import INSTRUCTIONS, SPLIT_INSTRUCTIONS
from perseus.core.profiles import Option, Profile, ProfileRow, Row, profile_from_rows
from perseus.formats.profiles import (
    PROFILE_FORMAT,
    load_profile,
    profile_from_json,
    profile_to_csv,
    profile_to_json,
)

__all__ = [
    "INSTRUCTIONS",
    "PROFILE_FORMAT",
    "SPLIT_INSTRUCTIONS",
    "Option",
    "Profile",
    "ProfileRow",
    "Row",
    "effective_options",
    "load_profile",
    "profile_from_json",
    "profile_from_rows",
    "profile_to_csv",
    "profile_to_json",
]


def effective_options(options: Iterable[Option], p_block_w: float) -> tuple[Option, ...]:
    """Drop options that are dominated once blocking power is counted.

    A GPU that finishes early idles at ``p_block_w`` until the time a slower option would have
    taken, so option ``a`` dominates ``b`` when ``a.time_s <= b.time_s`` and
    ``a.energy_j - p_block_w * a.time_s <= b.energy_j - p_block_w * b.time_s``.

    Args:
        options: Measured options of one instruction type.
        p_block_w: Blocking power in watts.

    Returns:
        The non-dominated options, time ascending (so effective energy strictly descending).
        Complexity O(k log k) for k options.
    """
    kept: list[Option] = []
    best = math.inf
    for opt in sorted(options, key=lambda o: (o.time_s, o.energy_j - p_block_w * o.time_s)):
        effective = opt.energy_j - p_block_w * opt.time_s
        if effective < best:
            kept.append(opt)
            best = effective
    return tuple(kept)

"""The target's own MTP head as a drafter kind (``--draft mtp``).

It loads the GGUF's NextN layers beside the target's trunk and drafts as a model tier named
``draft`` (:class:`~pyramid_gguf.native.mtp.MtpSequence`, reading the target's hidden
states): token by token through a :class:`~..proposers.DraftProposer`, priced by the head's
calibrated cost curve and the keep rates ``auto`` learns, like a draft model.
"""

from __future__ import annotations

from ....core.ladder import MTP
from .kind import DrafterKind

#: The MTP head's entry in the registry (:mod:`.`).
MTP_KIND = DrafterKind(MTP)

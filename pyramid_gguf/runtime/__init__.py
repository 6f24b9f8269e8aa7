"""What :class:`~pyramid_gguf.api.Pyramid` delegates to, one job a module, between the planner
and the user-facing API: ``steps`` (what a generation yields), ``loading`` (a ladder loaded
under a VRAM budget or on RPC servers), ``calibration`` (each tier's cost curve), ``facts``
(read-only facts of the loaded ladder), ``chats`` (chat templates and a chat turn's prompt),
``biases`` (logit biases checked and tokenized) and ``generation`` (one generation's steps on
a slot's thread)."""

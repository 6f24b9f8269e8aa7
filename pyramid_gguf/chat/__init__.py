"""Chat prompts and tool calls, pure Python (jinja2, jsonschema, llguidance; never llama.cpp).

- :mod:`.templates`: :class:`ChatTemplate` renders OpenAI messages and tools with a GGUF's
  Jinja template (or a built-in ChatML) as Hugging Face transformers does.
- :mod:`.tools`: the request's ``tools``, ``tool_choice``, ``parallel_tool_calls``, validated.
- :mod:`.toolcalls`: tool-call formats per model family (:mod:`.hermes`, :mod:`.llama3`),
  detected from the template, and llama.cpp's generic JSON format for any other template
  (:mod:`.generic`, with the system message that teaches it): parsing answers (whole or
  streaming, :mod:`.calls` for the result and the stream deltas) and the grammars that
  constrain calls (:mod:`.grammars`).
"""

from .calls import CallIds, Delta, Message, ToolCall, diff
from .generic import GenericFormat, TemplateCaps, probe_caps, prompt_messages
from .grammars import ToolConstraint
from .templates import ChatTemplate, normalise_messages
from .toolcalls import CallStream, ToolCallFormat, constraint, detect_tool_format
from .tools import Tool, ToolChoice, ToolRequest, parse_tool_request

__all__ = [
    "CallIds",
    "CallStream",
    "ChatTemplate",
    "Delta",
    "GenericFormat",
    "Message",
    "TemplateCaps",
    "Tool",
    "ToolCall",
    "ToolCallFormat",
    "ToolChoice",
    "ToolConstraint",
    "ToolRequest",
    "constraint",
    "detect_tool_format",
    "diff",
    "normalise_messages",
    "parse_tool_request",
    "probe_caps",
    "prompt_messages",
]

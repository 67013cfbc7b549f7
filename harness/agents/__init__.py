"""Agents: the protocol, the toolbox, the built-in agents (scripted, simulated, openai), and
agents named by the user as ``module:Class`` or ``path/to/file.py:Class`` (:mod:`.spec`)."""

from ..errors import ModelRequestError, ModelServerError
from .base import Agent, AgentOutput, AgentRegistry, CallRecord, Toolbox, ToolResult, registry
from .openai import OpenAIAgent
from .scripted import ScriptedAgent
from .simulated import SimulatedAgent
from .spec import AgentSpec, is_agent_spec, recorded_spec

__all__ = [
    "Agent",
    "AgentOutput",
    "AgentRegistry",
    "AgentSpec",
    "CallRecord",
    "ModelRequestError",
    "ModelServerError",
    "OpenAIAgent",
    "ScriptedAgent",
    "SimulatedAgent",
    "ToolResult",
    "Toolbox",
    "is_agent_spec",
    "recorded_spec",
    "registry",
]

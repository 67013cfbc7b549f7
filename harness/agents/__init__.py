"""Agents: the protocol, the toolbox, and the built-in agents (scripted, simulated, openai)."""

from ..errors import ModelRequestError, ModelServerError
from .base import Agent, AgentOutput, AgentRegistry, CallRecord, Toolbox, ToolResult, registry
from .openai import OpenAIAgent
from .scripted import ScriptedAgent
from .simulated import SimulatedAgent

__all__ = [
    "Agent",
    "AgentOutput",
    "AgentRegistry",
    "CallRecord",
    "ModelRequestError",
    "ModelServerError",
    "OpenAIAgent",
    "ScriptedAgent",
    "SimulatedAgent",
    "ToolResult",
    "Toolbox",
    "registry",
]

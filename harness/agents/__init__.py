"""Agents: the protocol, the toolbox, and the built-in agents (scripted, simulated, openai)."""

from .base import Agent, AgentOutput, AgentRegistry, Toolbox, ToolResult, registry

__all__ = ["Agent", "AgentOutput", "AgentRegistry", "ToolResult", "Toolbox", "registry"]

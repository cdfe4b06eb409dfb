"""``ccoll.hierarchy``: the user-facing names of the node map (README: ``ccoll.hierarchy.set_node_map``).

The node map and layouts live in :mod:`ccoll.collectives.nodes`, the hierarchical algorithms in
:mod:`ccoll.collectives.hierarchy`; this module only keeps the documented import path working.
"""
from __future__ import annotations

from .collectives.nodes import HIERARCHIES, Layout, UnevenNodesError, layout, nodes_of_group, set_node_map, split

__all__ = ["HIERARCHIES", "Layout", "UnevenNodesError", "layout", "nodes_of_group", "set_node_map", "split"]

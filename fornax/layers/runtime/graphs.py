"""Runtime graphs: capturing a stream's launches and copies into a :class:`Graph`,
instantiating it, replaying it as one launch, and destroying it."""

from __future__ import annotations

from .handles import Event, Graph, GraphNode, Stream
from .memory import RuntimeMemory


class GraphCapture(RuntimeMemory):
    """Graph capture and replay (``[runtime.graph]``)."""

    def begin_capture(self, stream: Stream) -> None:
        """Start recording ``stream``: its launches and asynchronous copies become graph
        nodes instead of running.  The legacy NULL stream cannot be captured."""
        s = self._stream(stream)
        if not self.graph_facts.get("supported", False):
            raise self._error(f"{self.facts['runtime']['api']} has no graph capture", "begin_capture",
                              condition="not_supported")
        if s.kind == "legacy":
            raise self._error("the legacy default stream cannot be captured", "begin_capture",
                              condition="capture_unsupported",
                              hint="capture a stream made with create_stream()")
        if s.capture is not None:
            raise self._error(f"stream {s.id} is already capturing", "begin_capture",
                              condition="invalid_value")
        s.capture = Graph(self, s)

    def _capture_node(self, stream: Stream, node: GraphNode) -> Event:
        """Add ``node`` to the graph ``stream`` is capturing; its (graph-node) event."""
        graph = stream.capture
        if graph is None:
            raise self._error(f"stream {stream.id} is not capturing", "begin_capture",
                              condition="invalid_value")
        graph.nodes.append(node)
        return Event(False, (), stream, 0.0, True, True)

    def end_capture(self, stream: Stream) -> Graph:
        """Stop recording and return the executable graph (capture end + instantiate)."""
        s = self._stream(stream)
        graph = s.capture
        if graph is None:
            raise self._error(f"stream {s.id} is not capturing", "end_capture",
                              condition="invalid_value")
        s.capture = None
        if graph.invalidated is not None:
            raise self._error(f"the capture was invalidated by an illegal call ({graph.invalidated})",
                              "end_capture", condition="capture_invalidated",
                              hint="capture again without synchronising calls")
        graph.instantiated = True
        self._graphs.add(graph)
        return graph

    def destroy_graph(self, graph: Graph) -> None:
        """Release an instantiated graph (cudaGraphExecDestroy); it can no longer be launched."""
        if not isinstance(graph, Graph) or graph not in self._graphs:
            raise self._error("not an instantiated graph of this runtime, or already destroyed",
                              "destroy_graph", condition="invalid_handle")
        self._graphs.discard(graph)
        graph.instantiated = False
        graph.nodes = []

    def graph_launch(self, graph: Graph, stream: Stream | None = None) -> Event:
        """Submit a captured graph as one launch: the first kernel pays the stream launch
        latency, every further kernel node ``[runtime.graph] node_launch_fraction`` of it."""
        if not isinstance(graph, Graph) or not graph.instantiated or graph.runtime is not self:
            raise self._error("not an instantiated graph of this runtime", "graph_launch",
                              condition="invalid_handle")
        s = self._stream(stream if stream is not None else graph.stream)
        if s.capture is not None:
            raise self._capture_error(s, "launching a graph into a capturing stream", "graph_launch",
                                      "capture_unsupported")
        fraction = float(self.graph_facts.get("node_launch_fraction", 1.0))
        q = self._before(s, ())
        first = True
        try:
            for node in graph.nodes:
                kind = node[0]
                if kind == "launch":
                    q.launch_scale = 1.0 if first else fraction
                    q.launch(*node[1:])
                    first = False
                elif kind == "h2d":
                    q.copy_h2d(node[1], node[2], host_rate=self._host_rate(node[2]))
                elif kind == "d2d":
                    q.copy_d2d(*node[1:])
                else:
                    q.copy_d2h(node[1], node[2], host_rate=self._host_rate(node[1]))
        finally:
            q.launch_scale = 1.0
        graph.replays += 1
        self.counts["graph_replays"] += 1
        self.counts["graph_nodes_replayed"] += len(graph.nodes)
        return self._after(s, q)

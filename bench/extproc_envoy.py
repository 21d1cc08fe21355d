"""The ext_proc baseline: `wasm-epp-extproc` (the same pick as the filter, one gRPC hop away)
and an Envoy that calls it the way upstream gateways call the EPP.

Envoy's side follows what the upstream EPP requires: request headers SEND, request body
FULL_DUPLEX_STREAMED (the only body mode upstream's EPP supports; the whole prompt travels to
the server and back), request trailers SEND (Envoy requires it with that body mode), fail
closed, the answer's `x-gateway-destination-endpoint` + `clear_route_cache` sending the request
to an ORIGINAL_DST cluster that reads the header. The response path is SKIP: the pick does not
need it, and upstream's response processing (usage parsing, model renaming back) has no
counterpart in the wasm-epp filter either, so leaving it on would measure something else.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench import common


@dataclass
class ExtProc:
    """A running `wasm-epp-extproc`."""

    port: int
    proc: common.Proc


def start_extproc(ctx: common.Ctx, procs: common.Procs, controller: common.Controller,
                  name: str = "extproc", threads: int = 1) -> ExtProc:
    """Starts the ext_proc server following `controller`. It has no health endpoint: whether
    it picks yet is checked through the Envoy that calls it."""
    port = common.free_port()
    proc = procs.start(name, [ctx.bin("wasm-epp-extproc"), "--listen", f"127.0.0.1:{port}",
                              "--controller", f"http://127.0.0.1:{controller.port}",
                              "--threads", str(threads)])
    return ExtProc(port, proc)


def extproc_envoy_config(admin_port: int, port: int, extproc: ExtProc) -> str:
    """Envoy with the ext_proc filter in front of an ORIGINAL_DST cluster (same listener and
    buffer limits as `envoy/envoy.yaml`, so only the picker differs)."""
    return f"""\
admin: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }} }} }}
static_resources:
  listeners:
  - name: inference
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    per_connection_buffer_limit_bytes: 16777216
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: inference
          stream_idle_timeout: 600s
          route_config:
            name: inference
            virtual_hosts:
            - name: inference
              domains: ["*"]
              routes:
              - match:
                  prefix: "/"
                  headers: [ {{ name: x-gateway-destination-endpoint, present_match: true }} ]
                route: {{ cluster: inference_pool, timeout: 600s }}
          http_filters:
          - name: envoy.filters.http.header_mutation
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
              mutations:
                request_mutations:
                - remove: x-gateway-destination-endpoint
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service: {{ envoy_grpc: {{ cluster_name: extproc }}, timeout: 10s }}
              failure_mode_allow: false
              allow_mode_override: true
              message_timeout: 10s
              processing_mode:
                request_header_mode: SEND
                request_body_mode: FULL_DUPLEX_STREAMED
                request_trailer_mode: SEND
                response_header_mode: SKIP
                response_body_mode: NONE
                response_trailer_mode: SKIP
          - name: envoy.filters.http.router
            typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
  clusters:
  - name: extproc
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: extproc
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {extproc.port} }} }} }}
  - name: inference_pool
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 2s
    circuit_breakers: {{ thresholds: [ {{ max_connections: 50000, max_pending_requests: 50000, max_requests: 50000, max_retries: 1000 }} ] }}
    per_connection_buffer_limit_bytes: 16777216
    original_dst_lb_config:
      use_http_header: true
      http_header_name: x-gateway-destination-endpoint
"""


def start_extproc_envoy(ctx: common.Ctx, procs: common.Procs, extproc: ExtProc,
                        concurrency: int = 1, name: str = "envoy-extproc",
                        extra_config: str = "") -> common.Envoy:
    """Starts Envoy calling `extproc` (`extra_config`: top-level bootstrap keys appended) and
    waits for its admin; whether the server picks yet is the caller's check."""
    admin, port = common.free_port(), common.free_port()
    config = extproc_envoy_config(admin, port, extproc) + extra_config
    return common.start_envoy(ctx, procs, config, admin, port, concurrency, name)

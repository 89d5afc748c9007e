// Encodes one span, as idemproxy exported it, with the OpenTelemetry JS
// SDK's own OTLP/HTTP JSON serializer (@opentelemetry/otlp-transformer), for
// test_tracing.py's cross-check. stdin: {"span": <one span of idemproxy's
// export>, "resource": {name: value}, "scope": {"name", "version"}};
// stdout: the serializer's ExportTraceServiceRequest. NODE_PATH: the
// packages' node_modules.
'use strict';
const { JsonTraceSerializer } = require('@opentelemetry/otlp-transformer');
const { resourceFromAttributes } = require('@opentelemetry/resources');

const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));
const s = input.span;
const hr = (ns) => {
  const v = BigInt(ns);
  return [Number(v / 1000000000n), Number(v % 1000000000n)];
};
const attributes = {};
for (const a of s.attributes || []) {
  attributes[a.key] = 'intValue' in a.value ? Number(a.value.intValue) : a.value.stringValue;
}
const ctx = (traceId, spanId) => ({ traceId, spanId, traceFlags: 1 });
const span = {
  name: s.name,
  kind: s.kind - 1, // the API's SpanKind: OTLP's less one
  spanContext: () => ctx(s.traceId, s.spanId),
  parentSpanContext: s.parentSpanId ? ctx(s.traceId, s.parentSpanId) : undefined,
  startTime: hr(s.startTimeUnixNano),
  endTime: hr(s.endTimeUnixNano),
  status: { code: (s.status && s.status.code) || 0 },
  attributes,
  links: (s.links || []).map((l) => ({ context: ctx(l.traceId, l.spanId), attributes: {} })),
  events: [],
  duration: [0, 0],
  ended: true,
  resource: resourceFromAttributes(input.resource),
  instrumentationScope: input.scope,
  droppedAttributesCount: 0,
  droppedEventsCount: 0,
  droppedLinksCount: 0,
};
process.stdout.write(Buffer.from(JsonTraceSerializer.serializeRequest([span])).toString('utf8'));

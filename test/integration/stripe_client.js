// The official Stripe Node SDK against idemproxy, for test_stripe_sdk.py.
//
//   node stripe_client.js PLAN.json
//
// PLAN: {"sdk_dir": DIR (where `npm install --prefix DIR stripe@V` put it),
//        "port": the proxy's port, "control": the fake API's base URL,
//        "calls": [{"id", "params", "key" (null: the SDK's own key), "port"
//                   (default: PLAN's), "max_retries", "timeout_ms",
//                   "resource" (optional, default "charges": the resource
//                   whose create() is called, a dotted path such as
//                   "v2.billing.meterEvents"),
//                   "after": ID (optional: start once the earlier call ID has
//                   ended), "after_received": KEY (optional: start once the
//                   fake API has received a request with Idempotency-Key KEY)}]}
// The calls run concurrently, each through its own client
// (new Stripe(key, {host, port, protocol: 'http', maxNetworkRetries, timeout})),
// as stripe.<resource>.create(params, {idempotencyKey}). Prints one JSON object:
// {"sdk_version", "results": {id: what the call resolved with or raised}}.
'use strict';

const fs = require('fs');
const http = require('http');
const path = require('path');

const plan = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const Stripe = require(require.resolve('stripe', { paths: [plan.sdk_dir] }));
const sdkVersion = JSON.parse(
    fs.readFileSync(path.join(plan.sdk_dir, 'node_modules', 'stripe', 'package.json'), 'utf8'),
).version;

function received(key) {
    return new Promise((resolve, reject) => {
        http
            .get(`${plan.control}/_test/received?key=${encodeURIComponent(key)}`, (res) => {
                let data = '';
                res.setEncoding('utf8');
                res.on('data', (c) => (data += c));
                res.on('end', () => resolve(JSON.parse(data).count));
            })
            .on('error', reject);
    });
}

async function waitReceived(key) {
    const deadline = Date.now() + 15000;
    while ((await received(key)) < 1) {
        if (Date.now() > deadline) throw new Error(`the fake API never received ${key}`);
        await new Promise((r) => setTimeout(r, 20));
    }
}

function headerOf(headers, name) {
    if (!headers) return null;
    const v = headers[name] ?? headers[name.toLowerCase()];
    return v === undefined ? null : v;
}

async function run(call, ended) {
    if (call.after) {
        if (!ended[call.after]) throw new Error(`call ${call.id}: no earlier call ${call.after}`);
        await ended[call.after];
    }
    if (call.after_received) await waitReceived(call.after_received);
    const stripe = new Stripe('sk_test_idemproxy', {
        host: '127.0.0.1',
        port: call.port ?? plan.port,
        protocol: 'http',
        maxNetworkRetries: call.max_retries ?? 0,
        timeout: call.timeout_ms ?? 20000,
        telemetry: false,
    });
    const resource = (call.resource ?? 'charges').split('.').reduce((o, k) => {
        if (!o || !o[k]) throw new Error(`call ${call.id}: no resource ${call.resource}`);
        return o[k];
    }, stripe);
    const t0 = Date.now();
    try {
        const obj = await resource.create(
            call.params,
            call.key ? { idempotencyKey: call.key } : undefined,
        );
        const raw = obj.lastResponse || {};
        return {
            raised: false,
            id_is_undefined: obj.id === undefined,
            body: obj,
            status: raw.statusCode ?? null,
            replayed: headerOf(raw.headers, 'x-idempotency-replayed'),
            content_type: headerOf(raw.headers, 'content-type'),
            elapsed_ms: Date.now() - t0,
        };
    } catch (err) {
        const E = Stripe.errors;
        return {
            raised: true,
            type: err.type ?? null,
            raw_type: err.rawType ?? null,
            class: err.constructor ? err.constructor.name : null,
            status: err.statusCode ?? null,
            code: err.code ?? null,
            message: err.message ?? null,
            is_stripe_error: err instanceof E.StripeError,
            is_idempotency_error: err instanceof E.StripeIdempotencyError,
            is_api_error: err instanceof E.StripeAPIError,
            is_connection_error: err instanceof E.StripeConnectionError,
            retry_after: headerOf(err.headers, 'retry-after'),
            content_type: headerOf(err.headers, 'content-type'),
            elapsed_ms: Date.now() - t0,
        };
    }
}

(async () => {
    const ended = {};
    for (const call of plan.calls) ended[call.id] = run(call, ended);
    const results = {};
    for (const call of plan.calls) results[call.id] = await ended[call.id];
    process.stdout.write(JSON.stringify({ sdk_version: sdkVersion, results }) + '\n');
})().catch((e) => {
    process.stderr.write(`stripe_client.js: ${e && e.stack ? e.stack : e}\n`);
    process.exit(1);
});

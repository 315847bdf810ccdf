// A foreign (non-Go) gRPC client for TestGRPCJSClient: @grpc/grpc-js drives
// the rate limit service's gRPC port with raw protobuf bytes prepared by the
// Go test. It prints "ok <scenario>" per scenario, "ready for shutdown" when
// the Go side should stop the server, and exits non-zero on any failure.
'use strict';
const grpc = require('@grpc/grpc-js');

const addr = process.env.RL_ADDR;
const small = Buffer.from(process.env.RL_SMALL_HEX, 'hex');
const large = require('fs').readFileSync(process.env.RL_LARGE_FILE);
const method = '/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit';
const raw = (b) => b;

function fail(msg) {
  console.log('FAIL ' + msg);
  process.exit(1);
}

function client(options) {
  return new grpc.Client(addr, grpc.credentials.createInsecure(), options || {});
}

function call(c, req, opts) {
  return new Promise((resolve) => {
    const handle = c.makeUnaryRequest(method, raw, raw, req, new grpc.Metadata(), opts || {}, (err, resp) => resolve({ err, resp }));
    if (opts && opts.cancelAfterStart) setImmediate(() => handle.cancel());
  });
}

// An answer is a RateLimitResponse: field 1 (overall_code) first, OK (1) or
// OVER_LIMIT (2).
function answered(r, what) {
  if (r.err) fail(what + ': ' + r.err.code + ' ' + r.err.details);
  if (r.resp.length < 2 || r.resp[0] !== 0x08 || (r.resp[1] !== 1 && r.resp[1] !== 2)) fail(what + ': not a RateLimitResponse: ' + r.resp.toString('hex'));
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const c = client();
  for (let i = 0; i < 20; i++) answered(await call(c, small), 'sequential call ' + i);
  console.log('ok sequential');

  const many = await Promise.all(Array.from({ length: 200 }, () => call(c, small)));
  many.forEach((r, i) => answered(r, 'multiplexed call ' + i));
  console.log('ok multiplexed');

  answered(await call(c, large), 'large call');
  console.log('ok large ' + large.length);

  const gz = client({ 'grpc.default_compression_algorithm': 2 }); // gzip
  answered(await call(gz, small), 'compressed call');
  answered(await call(gz, large), 'compressed large call');
  gz.close();
  console.log('ok compressed');

  const cancelled = await call(c, small, { cancelAfterStart: true });
  if (!cancelled.err || cancelled.err.code !== grpc.status.CANCELLED) fail('cancelled call: ' + (cancelled.err ? cancelled.err.code : 'answered'));
  answered(await call(c, small), 'call after a cancel');
  console.log('ok cancelled');

  answered(await call(c, small, { deadline: Date.now() + 5000 }), 'call with a deadline');
  const expired = await call(c, small, { deadline: Date.now() - 1 });
  if (!expired.err || expired.err.code !== grpc.status.DEADLINE_EXCEEDED) fail('expired deadline: ' + (expired.err ? expired.err.code : 'answered'));
  console.log('ok deadline');
  c.close();

  // Keepalive PINGs every 2 s with no call for 7 s: the connection stays up
  // (no GOAWAY for too many pings), and a call on it is answered.
  const ka = client({ 'grpc.keepalive_time_ms': 2000, 'grpc.keepalive_timeout_ms': 2000, 'grpc.keepalive_permit_without_calls': 1 });
  answered(await call(ka, small), 'first keepalive call');
  let dropped = false;
  const ch = ka.getChannel();
  const watch = (state) => {
    ch.watchConnectivityState(state, Infinity, () => {
      const s = ch.getConnectivityState(false);
      if (s !== grpc.connectivityState.READY) dropped = true;
      if (!done) watch(s);
    });
  };
  let done = false;
  watch(ch.getConnectivityState(false));
  await sleep(7000);
  if (dropped) fail('keepalive: the idle connection left READY');
  answered(await call(ka, small), 'call after idle keepalive');
  console.log('ok keepalive');

  // GOAWAY at shutdown: the Go side stops the server gracefully; grpc-js
  // traces the GOAWAY (the test reads the trace) and the channel leaves READY.
  console.log('ready for shutdown');
  for (let i = 0; i < 100 && !dropped; i++) await sleep(100);
  done = true;
  if (!dropped) fail('shutdown: the channel stayed READY');
  ka.close();
  console.log('ok shutdown');
}

main().catch((e) => fail('exception: ' + e.stack));

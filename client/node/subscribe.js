#!/usr/bin/env node
// A txoutbox publisher in Node.js: subscribe to an outbox, "publish", ack.
//
// The example to copy when writing a txoutbox publisher in JavaScript. It opens the
// bidirectional `txoutbox.v1.Relay/Subscribe` stream of a running txoutboxd (stubs loaded
// from the .proto files at run time by @grpc/proto-loader: no generated code), prints
// one JSON line per message (standing in for publishing to a broker) and answers each
// one on the same stream. The server does the hard parts (leases, fencing, retries with
// backoff, dead-letters, per-key order); a client answers every message it is given, and:
//
// - nacks a failed publish, with a retry delay, and publishes nothing more of that key
//   from the batch (the server gives those back, in order, in the nack's `released`);
// - extends the leases of what it still holds while a publish is slow (`extend_lease`
//   every third of the lease), so a slow broker does not make the server redeliver;
// - on `draining` (the server is shutting down) takes nothing new and answers what it
//   holds; when the stream ends or breaks, reconnects with exponential backoff;
// - on SIGINT/SIGTERM closes the window (`set_window(0)`), finishes the publish in
//   progress, releases the rest untried (their attempt is refunded) and half-closes the
//   stream; it exits once the server has ended it, after settling every answer sent.
//
//   client/node/subscribe --server 127.0.0.1:7411 --outbox orders --subscriber node-example
//
// Conversation, in protocol terms:
//   client -> open        (outbox, subscriber, window, lease)
//   server <- subscribed  (effective lease, window, max_attempts)
//   server <- batch       (messages, in id order)        whenever the window has room
//   client -> ack / nack / release / extend_lease / set_window
//   server <- settled     (one per answer: acked, retried, released, extended, fenced...)
//   server <- draining    (the server is shutting down: answer what you hold)

'use strict';

const path = require('node:path');
const { parseArgs } = require('node:util');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const USAGE = `usage: subscribe [--server host:port] [--outbox NAME] [--subscriber NAME]
                 [--topic T]... [--max-in-flight N] [--lease-ms MS] [--count N]
                 [--nack-first-attempt] [--publish-delay-ms MS] [--connect-timeout S]
                 [--max-reconnects N] [--proto-dir DIR]`;

function options() {
  const { values } = parseArgs({
    options: {
      server: { type: 'string', default: '127.0.0.1:7411' },
      outbox: { type: 'string', default: 'orders' },
      subscriber: { type: 'string', default: 'node-example' },
      topic: { type: 'string', multiple: true, default: [] },
      'max-in-flight': { type: 'string', default: '100' },
      'lease-ms': { type: 'string', default: '0' },
      count: { type: 'string', default: '0' },
      'nack-first-attempt': { type: 'boolean', default: false },
      'publish-delay-ms': { type: 'string', default: '0' },
      'connect-timeout': { type: 'string', default: '10' },
      'max-reconnects': { type: 'string', default: '-1' },
      'proto-dir': { type: 'string', default: path.join(__dirname, '..', '..', 'proto') },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  const number = (name) => {
    const value = Number(values[name]);
    if (!Number.isInteger(value)) fail(2, `--${name} ${values[name]}: expected a whole number`);
    return value;
  };
  return {
    server: values.server,
    outbox: values.outbox,
    subscriber: values.subscriber,
    topics: values.topic,
    maxInFlight: number('max-in-flight'),
    leaseMs: number('lease-ms'),
    count: number('count'),
    nackFirstAttempt: values['nack-first-attempt'],
    publishDelayMs: number('publish-delay-ms'),
    connectTimeoutS: Number(values['connect-timeout']),
    maxReconnects: number('max-reconnects'),
    protoDir: values['proto-dir'],
  };
}

/** Diagnostics go to stderr; stdout carries only the JSON lines of messages. */
function log(text) {
  process.stderr.write(`txoutbox_subscriber: ${text}\n`);
}

function fail(code, text) {
  log(text);
  process.exit(code);
}

function loadRelay(protoDir) {
  const definition = protoLoader.loadSync('txoutbox/v1/relay.proto', {
    includeDirs: [protoDir],
    keepCase: true,
    longs: String, // int64 ids as decimal strings: exact beyond 2^53
    enums: String,
    oneofs: true, // `request` / `response` name the field that is set
  });
  return grpc.loadPackageDefinition(definition).txoutbox.v1.Relay;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Stands in for publishing to a broker: one JSON line per message on stdout. */
async function publish(message, answer, delayMs) {
  if (delayMs > 0) await sleep(delayMs); // a slow broker
  const seconds = Number(message.created_at?.seconds ?? 0);
  const line = {
    id: Number(message.id),
    topic: message.topic,
    key: message.key ?? null,
    payload: Buffer.from(message.payload ?? []).toString('utf8'),
    headers: message.headers ?? {},
    attempts: message.attempts,
    created_at: new Date(seconds * 1000 + (message.created_at?.nanos ?? 0) / 1e6).toISOString(),
    answer,
  };
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

/** One subscription: from `open` until the stream ends. Resolves to how it ended. */
function subscribeOnce(client, args, state) {
  return new Promise((resolve) => {
    const call = client.Subscribe();
    let leaseMs = args.leaseMs;
    let draining = false;
    let closing = false;
    let halfClosed = false;
    let ended = false;
    // A write after `call.end()` does not just fail: Node destroys the call, and with it
    // the writes still buffered (the last ack, the half-close), which then never reach
    // the server. So nothing is sent once the stream is half-closed.
    const send = (request) => {
      if (!halfClosed) call.write(request);
    };
    const held = new Map(); // id -> message, everything received and not yet answered
    const queue = []; // batches waiting to be published, in order
    let working = false;
    let leaseTimer = null;

    const finish = (outcome) => {
      if (ended) return;
      ended = true;
      clearInterval(leaseTimer);
      state.current = null;
      resolve(outcome);
    };
    // Our side is done: no more answers (the lease timer stops too). The server applies
    // and settles what was sent, gives back anything else, then ends the stream: only
    // then ('end') does the script go on, so its last answers are never cut off.
    const halfClose = () => {
      if (halfClosed) return;
      halfClosed = true;
      clearInterval(leaseTimer);
      call.end();
    };
    const close = (why) => {
      if (closing) return;
      closing = true;
      log(why);
      // Nothing new, give back what is untouched (attempt refunded), end the stream.
      send({ set_window: { max_in_flight: 0 } });
      queue.length = 0;
      const untouched = [...held.keys()].filter((id) => id !== state.publishing);
      if (untouched.length) send({ release: { ids: untouched } });
      // Given back: no longer ours to extend (their extension would only come back fenced).
      for (const id of untouched) held.delete(id);
      if (state.publishing === null) halfClose();
    };
    state.current = { close };

    // While a publish is slow, keep everything held leased: one request for all ids.
    const extendLeases = () => {
      if (held.size && leaseMs > 0) send({ extend_lease: { ids: [...held.keys()], lease_ms: leaseMs } });
    };

    const work = async () => {
      if (working) return;
      working = true;
      while (queue.length && !closing) {
        const batch = queue.shift();
        const failedKeys = new Set();
        for (const message of batch) {
          if (closing) break;
          const key = message.key ?? null;
          if (key !== null && failedKeys.has(key)) continue; // the server releases it
          if (args.count && state.acksSent >= args.count) {
            send({ release: { ids: [message.id] } }); // more than asked for: untried
            held.delete(message.id);
            continue;
          }
          state.publishing = message.id;
          if (args.nackFirstAttempt && message.attempts === 1) {
            await publish(message, 'nack', args.publishDelayMs);
            send({
              nack: {
                id: message.id,
                error: 'nacked on purpose: first attempt (--nack-first-attempt)',
                retry_delay_ms: 200,
              },
            });
            if (key !== null) failedKeys.add(key);
          } else {
            await publish(message, 'ack', args.publishDelayMs);
            // At once, not after the batch: until its ack is sent, a message stays held
            // and its lease is extended, so a slow batch does not lose its first messages.
            send({ ack: { ids: [message.id] } });
            state.acksSent += 1;
          }
          held.delete(message.id);
          state.publishing = null;
        }
        // Held back behind a failed key: the nack's settlement lists them as released.
        for (const message of batch) {
          if (failedKeys.has(message.key ?? null) && held.has(message.id)) held.delete(message.id);
        }
      }
      working = false;
      if (closing && !ended) halfClose();
    };

    call.on('data', (response) => {
      switch (response.response) {
        case 'subscribed': {
          const s = response.subscribed;
          leaseMs = Number(s.lease_ms);
          state.attempt = 0; // connected: the next reconnection starts from a short delay
          log(`subscribed to '${args.outbox}' as ${s.owner} (lease ${s.lease_ms} ms, window ${s.max_in_flight}, max attempts ${s.max_attempts})`);
          leaseTimer = setInterval(extendLeases, Math.max(100, Math.floor(leaseMs / 3)));
          break;
        }
        case 'batch':
          if (closing || draining) return; // sent before the server saw us; it takes them back
          for (const message of response.batch.messages) held.set(message.id, message);
          queue.push(response.batch.messages);
          work();
          break;
        case 'settled': {
          const settled = response.settled;
          for (const id of settled.acked ?? []) state.acked.add(id);
          const outcomes = ['retried', 'dead_lettered', 'released', 'fenced']
            .filter((field) => settled[field]?.length)
            .map((field) => `${field} [${settled[field].join(', ')}]`);
          if (settled.rejected) outcomes.push(`rejected [${settled.rejected.ids.join(', ')}]: ${settled.rejected.reason}`);
          if (outcomes.length) log(`settled: ${outcomes.join(', ')}`);
          if (args.count && state.acked.size >= args.count) close(`${state.acked.size} messages acked; closing the stream`);
          break;
        }
        case 'leases_expired':
          log(`leases ran out before we answered, stop publishing: [${response.leases_expired.ids.join(', ')}]`);
          for (const id of response.leases_expired.ids) held.delete(id);
          break;
        case 'draining':
          draining = true;
          log('the server is draining: answering what we hold, then reconnecting');
          break;
        default:
          break;
      }
    });
    call.on('error', (error) => finish({ error }));
    call.on('end', () => finish({ closedByUs: closing }));
    send({
      open: {
        outbox: args.outbox,
        subscriber: args.subscriber,
        topics: args.topics,
        max_in_flight: args.maxInFlight,
        lease_ms: args.leaseMs,
      },
    });
  });
}

/** Errors a reconnection cannot fix: the request itself is wrong. */
const PERMANENT = new Set([
  grpc.status.NOT_FOUND,
  grpc.status.INVALID_ARGUMENT,
  grpc.status.PERMISSION_DENIED,
  grpc.status.UNAUTHENTICATED,
  grpc.status.UNIMPLEMENTED,
]);

function waitForReady(client, seconds) {
  return new Promise((resolve) => {
    client.waitForReady(Date.now() + seconds * 1000, (error) => resolve(!error));
  });
}

async function main() {
  const args = options();
  let Relay;
  try {
    Relay = loadRelay(args.protoDir);
  } catch (error) {
    fail(2, `cannot load the .proto files from ${args.protoDir}: ${error.message}; pass --proto-dir`);
  }
  const client = new Relay(args.server, grpc.credentials.createInsecure(), {
    'grpc.max_receive_message_length': -1,
  });
  if (!(await waitForReady(client, args.connectTimeoutS))) {
    fail(2, `cannot connect to ${args.server} within ${args.connectTimeoutS}s: is txoutboxd running there? (--server host:port)`);
  }

  const state = { acked: new Set(), acksSent: 0, publishing: null, current: null, stopping: false, attempt: 0 };
  for (const signal of ['SIGINT', 'SIGTERM']) {
    process.on(signal, () => {
      if (state.stopping) process.exit(130); // a second signal: at once
      state.stopping = true;
      if (state.current) state.current.close(`${signal}: finishing the publish in progress, releasing the rest`);
    });
  }

  for (;;) {
    const outcome = await subscribeOnce(client, args, state);
    if (args.count && state.acked.size >= args.count) {
      log('stream closed');
      return 0;
    }
    if (state.stopping) {
      log('stopped');
      return 0;
    }
    if (outcome.error && PERMANENT.has(outcome.error.code)) {
      log(`the stream failed: ${grpc.status[outcome.error.code]}: ${outcome.error.details}`);
      return 1;
    }
    // A drain, a restart or a broken stream: reconnect with exponential backoff and jitter.
    state.attempt += 1;
    if (args.maxReconnects >= 0 && state.attempt > args.maxReconnects) {
      log(`giving up after ${args.maxReconnects} reconnections`);
      return 1;
    }
    const delay = Math.min(10_000, 100 * 2 ** (state.attempt - 1)) * (0.5 + Math.random() / 2);
    const why = outcome.error ? `${grpc.status[outcome.error.code]}: ${outcome.error.details}` : 'the server ended the stream';
    log(`${why}; reconnecting in ${Math.round(delay)} ms`);
    await sleep(delay);
  }
}

main().then((code) => process.exit(code));

#!/usr/bin/env node
// `txoutbox-subscribe`: subscribe to an outbox, print each message as one JSON line on
// stdout (where a real publisher would send it to a broker) and ack it. What the server
// says goes to stderr.
//
// Exit codes: 0 done (`--count` reached) or stopped by SIGINT/SIGTERM; 1 the server
// refused the subscription (an unknown outbox, credentials) or `--max-reconnects` ran
// out; 2 no server at start, or bad options; 130 a second signal while stopping.

import { parseArgs } from 'node:util';
import {
  ConnectError,
  Message,
  Nack,
  ReconnectsExhausted,
  Release,
  Subscriber,
  SubscriberEvent,
  SubscriptionRefused,
} from './index';

const USAGE = `usage: txoutbox-subscribe [--server host:port]... [--outbox NAME] [--subscriber NAME]
         [--topic T]... [--group G] [--max-in-flight N] [--lease-ms MS] [--count N]
         [--nack-first-attempt] [--publish-delay-ms MS] [--connect-timeout S]
         [--max-reconnects N] [--token TOKEN] [--tls] [--tls-ca FILE]
         [--tls-cert FILE --tls-key FILE]`;

function log(text: string): void {
  process.stderr.write(`txoutbox-subscribe: ${text}\n`);
}

function fail(code: number, text: string): never {
  log(text);
  process.exit(code);
}

function options() {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        server: { type: 'string', multiple: true },
        outbox: { type: 'string', default: 'default' },
        subscriber: { type: 'string', default: 'txoutbox-subscribe' },
        topic: { type: 'string', multiple: true, default: [] },
        group: { type: 'string', default: '' },
        'max-in-flight': { type: 'string', default: '100' },
        'lease-ms': { type: 'string', default: '0' },
        count: { type: 'string', default: '0' },
        'nack-first-attempt': { type: 'boolean', default: false },
        'publish-delay-ms': { type: 'string', default: '0' },
        'connect-timeout': { type: 'string', default: '10' },
        'max-reconnects': { type: 'string', default: '-1' },
        token: { type: 'string', default: process.env.TXOUTBOX_TOKEN },
        tls: { type: 'boolean', default: false },
        'tls-ca': { type: 'string' },
        'tls-cert': { type: 'string' },
        'tls-key': { type: 'string' },
        help: { type: 'boolean', default: false },
      },
    }));
  } catch (error) {
    fail(2, `${(error as Error).message}\n${USAGE}`);
  }
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  const number = (name: keyof typeof values) => {
    const value = Number(values[name]);
    if (!Number.isFinite(value)) fail(2, `--${name} ${values[name]}: expected a number`);
    return value;
  };
  if ((values['tls-cert'] === undefined) !== (values['tls-key'] === undefined)) {
    fail(2, '--tls-cert and --tls-key go together');
  }
  return {
    servers: values.server ?? ['127.0.0.1:7411'],
    outbox: values.outbox as string,
    subscriber: values.subscriber as string,
    topics: values.topic as string[],
    group: values.group as string,
    maxInFlight: number('max-in-flight'),
    leaseMs: number('lease-ms'),
    count: number('count'),
    nackFirstAttempt: values['nack-first-attempt'] as boolean,
    publishDelayMs: number('publish-delay-ms'),
    connectTimeoutS: number('connect-timeout'),
    maxReconnects: number('max-reconnects'),
    credentials: {
      token: values.token,
      tls: values.tls as boolean,
      ca: values['tls-ca'],
      cert: values['tls-cert'],
      key: values['tls-key'],
    },
  };
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

function jsonLine(message: Message, answer: string): string {
  return JSON.stringify({
    id: Number(message.id),
    topic: message.topic,
    key: message.key,
    payload: message.payload.toString('utf8'),
    headers: message.headers,
    attempts: message.attempts,
    created_at: message.createdAt.toISOString(),
    answer,
  });
}

async function main(): Promise<number> {
  const args = options();
  const acked = new Set<string>();
  let acksSent = 0;
  let closing = false;
  let subscriber: Subscriber;

  const onEvent = (event: SubscriberEvent) => {
    switch (event.kind) {
      case 'subscribed':
        log(`subscribed to '${args.outbox}' on ${event.server} as ${event.owner} (lease ${event.leaseMs} ms, window ${event.maxInFlight}, max attempts ${event.maxAttempts})`);
        break;
      case 'settled': {
        const outcomes = (['retried', 'deadLettered', 'released', 'fenced'] as const)
          .filter((field) => event[field].length)
          .map((field) => `${field} [${event[field].join(', ')}]`);
        if (event.rejected.length || event.rejectedReason) outcomes.push(`rejected [${event.rejected.join(', ')}]: ${event.rejectedReason}`);
        if (outcomes.length) log(`settled: ${outcomes.join(', ')}`);
        for (const id of event.acked) acked.add(id);
        if (args.count && acked.size >= args.count && !closing) {
          closing = true;
          log(`${acked.size} messages acked; closing the stream`);
          subscriber.stop();
        }
        break;
      }
      case 'leasesExpired':
        log(`leases ran out before we answered, stop publishing: [${event.ids.join(', ')}]`);
        break;
      case 'draining':
        log('the server is draining: answering what we hold, then reconnecting');
        break;
      case 'reconnecting':
        log(`${event.reason}; reconnecting in ${Math.round(event.delayMs)} ms`);
        break;
    }
  };

  subscriber = new Subscriber({
    servers: args.servers,
    outbox: args.outbox,
    name: args.subscriber,
    topics: args.topics,
    group: args.group,
    maxInFlight: args.maxInFlight,
    leaseMs: args.leaseMs,
    credentials: args.credentials,
    connectTimeoutMs: args.connectTimeoutS * 1000,
    maxReconnects: args.maxReconnects < 0 ? undefined : args.maxReconnects,
    onEvent,
  });

  const print = async (message: Message) => {
    if (args.count && acksSent >= args.count) throw new Release(); // more than asked for: untried
    if (args.publishDelayMs > 0) await sleep(args.publishDelayMs); // a slow broker
    if (args.nackFirstAttempt && message.attempts === 1) {
      process.stdout.write(`${jsonLine(message, 'nack')}\n`);
      throw new Nack('nacked on purpose: first attempt (--nack-first-attempt)', 200);
    }
    process.stdout.write(`${jsonLine(message, 'ack')}\n`);
    acksSent += 1;
  };

  try {
    await subscriber.runUntilSignal(print);
  } catch (error) {
    if (error instanceof ConnectError) fail(2, `${error.message} (--server host:port)`);
    if (error instanceof SubscriptionRefused) fail(1, `the stream failed: ${error.message}`);
    if (error instanceof ReconnectsExhausted) fail(1, error.message);
    throw error;
  }
  log(args.count && acked.size >= args.count ? 'stream closed' : 'stopped');
  return 0;
}

main().then(
  (code) => process.exit(code),
  (error) => fail(2, String(error?.stack ?? error)),
);

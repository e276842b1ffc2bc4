// The subscriber: holds a `Subscribe` stream open and hands each message to a handler.

import * as fs from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import type { SubscribeRequest } from './generated/txoutbox/v1/SubscribeRequest';
import type { SubscribeResponse__Output } from './generated/txoutbox/v1/SubscribeResponse';
import type { RelayClient } from './generated/txoutbox/v1/Relay';
import { backoffDelayMs, Session } from './session';
import { txoutboxV1 } from './stubs';
import {
  ConnectError,
  Credentials,
  Message,
  ReconnectsExhausted,
  SubscriberEvent,
  SubscriptionRefused,
} from './types';

export type Handler = (message: Message) => Promise<void> | void;

export interface SubscriberOptions {
  /** One address or several (replicas, tried in turn): `host:port`, or with `http://` /
   * `https://`. */
  servers: string | string[];
  outbox: string;
  /** This subscriber's name in the server's logs and stats. */
  name?: string;
  /** Only these topics (default: every topic). */
  topics?: string[];
  /** Join this subscription group of the outbox (required when it declares groups, and
   * then without `topics`): every group receives every row, and the subscribers of one
   * group share its rows by key. */
  group?: string;
  /** Most messages held unanswered at once (default 100). */
  maxInFlight?: number;
  /** Lease per message in milliseconds (default: the outbox's `lease`). */
  leaseMs?: number;
  credentials?: Credentials;
  /** How long to wait at start for a server to accept a connection (default 10 s). */
  connectTimeoutMs?: number;
  /** Give up after this many reconnections in a row (default: never). */
  maxReconnects?: number;
  onEvent?: (event: SubscriberEvent) => void;
}

/** gRPC status codes a reconnection cannot fix: the request itself is wrong. */
const PERMANENT = new Set([
  grpc.status.NOT_FOUND,
  grpc.status.INVALID_ARGUMENT,
  grpc.status.PERMISSION_DENIED,
  grpc.status.UNAUTHENTICATED,
  grpc.status.UNIMPLEMENTED,
]);

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Holds a `Subscribe` stream open to a txoutboxd and hands each message to a handler:
 * resolving acks it; throwing {@link Nack}, {@link DeadLetter} or {@link Release} answers
 * that instead; any other error nacks it with its message.
 *
 * Messages are handled one at a time, in the order the server sends them (per key: in id
 * order). Leases of held messages are extended while a handler runs; a drain, a restart
 * or a broken connection means reconnecting with backoff (to the next of `servers`).
 * {@link Subscriber.stop} (or SIGINT/SIGTERM under {@link Subscriber.runUntilSignal})
 * closes gracefully: the handler call in progress finishes and is answered, untouched
 * messages go back with their attempt refunded, and `run` resolves once the server has
 * settled every answer.
 */
export class Subscriber {
  private readonly servers: string[];
  private readonly options: Required<Omit<SubscriberOptions, 'onEvent' | 'maxReconnects' | 'credentials' | 'servers'>>;
  private readonly credentials: Credentials;
  private stopping = false;
  private wakeUp: (() => void) | null = null;
  private current: Stream | null = null;

  constructor(private readonly settings: SubscriberOptions) {
    this.servers = typeof settings.servers === 'string' ? [settings.servers] : [...settings.servers];
    if (!this.servers.length) throw new Error('at least one server address');
    this.options = {
      outbox: settings.outbox,
      name: settings.name ?? 'txoutbox-node',
      topics: settings.topics ?? [],
      group: settings.group ?? '',
      maxInFlight: settings.maxInFlight ?? 100,
      leaseMs: settings.leaseMs ?? 0,
      connectTimeoutMs: settings.connectTimeoutMs ?? 10_000,
    };
    this.credentials = settings.credentials ?? {};
    if ((this.credentials.cert === undefined) !== (this.credentials.key === undefined)) {
      throw new Error('a client certificate (cert) and its key (key) go together');
    }
  }

  /** Subscribes and handles messages until {@link Subscriber.stop}; rejects with a
   * {@link SubscriberError} when it cannot go on. */
  async run(handler: Handler): Promise<void> {
    const clients = new Map<string, RelayClient>();
    try {
      let server = await this.connect(clients);
      let failures = 0;
      while (!this.stopping) {
        const stream = new Stream(this, clients.get(server)!, server, handler);
        this.current = stream;
        const error = await stream.run();
        this.current = null;
        if (this.stopping) return;
        if (error && PERMANENT.has(error.code)) {
          throw new SubscriptionRefused(grpc.status[error.code], error.details);
        }
        failures = stream.session.subscribed ? 1 : failures + 1;
        const { maxReconnects } = this.settings;
        if (maxReconnects !== undefined && failures > maxReconnects) {
          throw new ReconnectsExhausted(`giving up after ${maxReconnects} reconnections`);
        }
        const delayMs = backoffDelayMs(failures, Math.random());
        const reason = error ? `${grpc.status[error.code]}: ${error.details}` : 'the server ended the stream';
        this.event({ kind: 'reconnecting', reason, delayMs });
        await new Promise<void>((resolve) => {
          this.wakeUp = resolve;
          setTimeout(resolve, delayMs);
        });
        this.wakeUp = null;
        server = this.servers[(this.servers.indexOf(server) + 1) % this.servers.length];
        if (!clients.has(server)) clients.set(server, this.client(server));
      }
    } finally {
      for (const client of clients.values()) client.close();
    }
  }

  /** {@link Subscriber.run} with SIGINT and SIGTERM stopping it gracefully; a second
   * signal exits the process at once (code 130). */
  async runUntilSignal(handler: Handler): Promise<void> {
    const onSignal = (signal: NodeJS.Signals) => {
      if (this.stopping) process.exit(130);
      this.log(`${signal}: finishing the publish in progress, releasing the rest`);
      this.stop();
    };
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
    try {
      await this.run(handler);
    } finally {
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
    }
  }

  /** Stops gracefully (see the class); more than once is harmless. */
  stop(): void {
    this.stopping = true;
    this.wakeUp?.();
    this.current?.close();
  }

  /** @internal */
  get stoppingNow(): boolean {
    return this.stopping;
  }

  /** @internal */
  get sessionOptions() {
    return this.options;
  }

  /** @internal */
  get metadata(): grpc.Metadata {
    const metadata = new grpc.Metadata();
    if (this.credentials.token) metadata.set('authorization', `Bearer ${this.credentials.token}`);
    return metadata;
  }

  /** @internal */
  event(event: SubscriberEvent): void {
    this.settings.onEvent?.(event);
  }

  /** @internal Messages about stopping, when there is nobody to tell but stderr. */
  log(text: string): void {
    process.stderr.write(`txoutbox-subscribe: ${text}\n`);
  }

  private client(server: string): RelayClient {
    const { Relay } = txoutboxV1();
    return new Relay(target(server), channelCredentials(this.credentials), {
      // A response is at most the server's `server.max_message_bytes`: take what it sends.
      'grpc.max_receive_message_length': -1,
      'grpc.keepalive_time_ms': 20_000,
      'grpc.keepalive_timeout_ms': 10_000,
    });
  }

  /** The first server that accepts a connection within `connectTimeoutMs`. */
  private async connect(clients: Map<string, RelayClient>): Promise<string> {
    for (const server of this.servers) {
      const client = this.client(server);
      clients.set(server, client);
      const ready = await new Promise<boolean>((resolve) => {
        client.waitForReady(Date.now() + this.options.connectTimeoutMs, (error) => resolve(!error));
      });
      if (ready) return server;
    }
    throw new ConnectError(
      `cannot connect to ${this.servers.join(', ')} within ${this.options.connectTimeoutMs / 1000}s: is txoutboxd running there?`,
    );
  }
}

/** One subscription: reads responses, runs the handler on one message at a time, extends
 * leases. */
class Stream {
  readonly session: Session;
  private readonly call: grpc.ClientDuplexStream<SubscribeRequest, SubscribeResponse__Output>;
  private leaseTimer: NodeJS.Timeout | null = null;
  /** The loop publishing the held messages, while one runs. */
  private working: Promise<void> | null = null;
  private ended = false;

  constructor(
    private readonly subscriber: Subscriber,
    client: RelayClient,
    private readonly server: string,
    private readonly handler: Handler,
  ) {
    this.session = new Session(subscriber.sessionOptions);
    this.call = client.Subscribe(subscriber.metadata);
  }

  run(): Promise<grpc.ServiceError | null> {
    return new Promise((resolve) => {
      const finish = (error: grpc.ServiceError | null) => {
        if (this.ended) return;
        this.ended = true;
        if (this.leaseTimer) clearInterval(this.leaseTimer);
        // A handler call in progress finishes before the next stream opens, so a key's
        // messages are never published by two streams of this subscriber at once.
        void (this.working ?? Promise.resolve()).then(() => resolve(error));
      };
      this.call.on('data', (response: SubscribeResponse__Output) => this.onResponse(response));
      this.call.on('error', (error: grpc.ServiceError) => finish(error));
      this.call.on('end', () => finish(null));
      this.send([this.session.open()]);
      if (this.subscriber.stoppingNow) this.close();
    });
  }

  close(): void {
    this.send(this.session.close());
  }

  private send(requests: SubscribeRequest[]): void {
    if (this.session.halfClosed || this.ended) return;
    for (const request of requests) this.call.write(request);
    if (this.session.readyToHalfClose) {
      this.session.halfClosed = true;
      if (this.leaseTimer) clearInterval(this.leaseTimer);
      this.call.end();
    }
  }

  private onResponse(response: SubscribeResponse__Output): void {
    const session = this.session;
    switch (response.response) {
      case 'subscribed': {
        const s = response.subscribed!;
        session.subscribed = true;
        session.leaseMs = Number(s.lease_ms);
        this.subscriber.event({
          kind: 'subscribed',
          server: this.server,
          owner: s.owner,
          leaseMs: Number(s.lease_ms),
          maxInFlight: s.max_in_flight,
          maxAttempts: s.max_attempts,
        });
        this.leaseTimer = setInterval(() => {
          const request = session.extension();
          if (request) this.send([request]);
        }, Math.max(100, Math.floor(session.leaseMs / 3)));
        break;
      }
      case 'batch':
        session.onBatch(response.batch!);
        this.working ??= this.work().finally(() => {
          this.working = null;
        });
        break;
      case 'settled': {
        const s = response.settled!;
        this.subscriber.event({
          kind: 'settled',
          acked: s.acked,
          retried: s.retried,
          deadLettered: s.dead_lettered,
          released: s.released,
          extended: s.extended,
          fenced: s.fenced,
          rejected: s.rejected?.ids ?? [],
          rejectedReason: s.rejected?.reason ?? '',
        });
        break;
      }
      case 'leases_expired': {
        const ids = response.leases_expired!.ids;
        this.send(session.onLeasesExpired(ids));
        this.subscriber.event({ kind: 'leasesExpired', ids });
        break;
      }
      case 'draining':
        session.draining = true;
        this.subscriber.event({ kind: 'draining' });
        break;
      default:
        break;
    }
  }

  /** Publishes the held messages one at a time, until none is left. */
  private async work(): Promise<void> {
    for (let message = this.session.nextMessage(); message && !this.ended; message = this.session.nextMessage()) {
      let error: unknown;
      try {
        await this.handler(message);
      } catch (failure) {
        error = failure; // the handler's failure is the message's outcome
      }
      this.send(this.session.answer(message, error));
    }
  }
}

/** A gRPC target from an address as users write it (`host:port`, or with a scheme). */
function target(server: string): string {
  return server.replace(/^https?:\/\//, '').replace(/\/+$/, '');
}

function read(value: string | Buffer | undefined): Buffer | null {
  if (value === undefined) return null;
  return Buffer.isBuffer(value) ? value : fs.readFileSync(value);
}

function channelCredentials(credentials: Credentials): grpc.ChannelCredentials {
  const tls = credentials.tls || credentials.ca !== undefined || credentials.cert !== undefined;
  if (!tls) return grpc.credentials.createInsecure();
  return grpc.credentials.createSsl(read(credentials.ca), read(credentials.key), read(credentials.cert));
}

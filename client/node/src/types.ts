// The types a publisher's code touches: messages, outcomes, credentials, events, errors.

/** One outbox row handed to the publisher. */
export interface Message {
  /** Unique within the outbox, growing with insertion order, as a decimal string (an
   * int64, exact beyond 2^53): deduplicate on it downstream (delivery is at-least-once). */
  id: string;
  topic: string;
  /** The ordering key; `null` for a keyless row. A key's messages come one after another. */
  key: string | null;
  payload: Buffer;
  headers: Record<string, string>;
  /** 1 on the first delivery. */
  attempts: number;
  /** When the producer inserted the row (the database's clock). */
  createdAt: Date;
  /** Names this delivery (row, attempt, lease holder); opaque. The subscriber sends it
   * back with the message's answer, so the answer applies to this delivery only
   * (docs/lease-tokens.md). Empty from a server before lease tokens. */
  leaseToken: string;
}

// Outcomes other than an ack: a handler throws one. Returning (resolving) acks the
// message; any other error nacks it with its message.

/** The publish failed: the server retries after its backoff (or `retryAfterMs`, capped by
 * the outbox's `backoff.maximum`), and dead-letters the message once its attempts are used
 * up. The later messages of its key come back after it. */
export class Nack extends Error {
  constructor(
    message: string,
    readonly retryAfterMs?: number,
  ) {
    super(message);
    this.name = 'Nack';
  }
}

/** No retry can help (a payload the broker will never take): the row is parked for an
 * operator, with this error. */
export class DeadLetter extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'DeadLetter';
  }
}

/** Give the message back untried: no attempt counted, no error recorded; claimable again
 * after `delayMs` (at most 7 days). */
export class Release extends Error {
  constructor(readonly delayMs: number = 0) {
    super(`released (delay ${delayMs} ms)`);
    this.name = 'Release';
  }
}

/** How to reach a server that asks for them: a bearer token (an identity of
 * `server.auth`), TLS (`tls`, or any of the PEM files: paths or contents), mutual TLS
 * (`cert` and `key`). `ca` defaults to the system's roots. */
export interface Credentials {
  token?: string;
  tls?: boolean;
  ca?: string | Buffer;
  cert?: string | Buffer;
  key?: string | Buffer;
}

/** A stream is open on `server`: the lease owner it got and the effective settings. */
export interface Subscribed {
  kind: 'subscribed';
  server: string;
  owner: string;
  leaseMs: number;
  maxInFlight: number;
  maxAttempts: number;
}

/** The server applied one answer: what became of each id it named. */
export interface Settled {
  kind: 'settled';
  acked: string[];
  retried: string[];
  deadLettered: string[];
  released: string[];
  extended: string[];
  /** Ids the stream no longer held (a lease that ran out): the answer was ignored. */
  fenced: string[];
  /** An answer the server refused (nothing applied, the messages stay held), and why. */
  rejected: string[];
  rejectedReason: string;
}

/** These leases ran out before their answer: the messages may go to someone else. */
export interface LeasesExpired {
  kind: 'leasesExpired';
  ids: string[];
}

/** The server shuts down: what is held is answered, then the subscriber reconnects. */
export interface Draining {
  kind: 'draining';
}

/** The stream ended (`reason`); the next one opens in `delayMs`. */
export interface Reconnecting {
  kind: 'reconnecting';
  reason: string;
  delayMs: number;
}

export type SubscriberEvent = Subscribed | Settled | LeasesExpired | Draining | Reconnecting;

/** The subscriber stopped for good; see the subclasses. */
export class SubscriberError extends Error {}

/** No server accepted a connection within `connectTimeoutMs` at start. */
export class ConnectError extends SubscriberError {}

/** The server refused the subscription in a way no reconnection fixes (an unknown outbox,
 * missing or wrong credentials, a bad argument): `code` is the gRPC status's name. */
export class SubscriptionRefused extends SubscriberError {
  constructor(
    readonly code: string,
    readonly details: string,
  ) {
    super(`${code}: ${details}`);
  }
}

/** `maxReconnects` reconnections in a row found no server. */
export class ReconnectsExhausted extends SubscriberError {}

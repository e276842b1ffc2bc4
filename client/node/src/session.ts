// One subscription's bookkeeping, without I/O: what it holds, what to publish next, what
// to answer. The rules (the same as the Python package's):
//
// - messages are published one at a time, in the order received (a key's in id order),
//   each answered as soon as its publish returned;
// - after a message of a key fails, nothing more of that key is published from what the
//   stream holds: after a nack the server gives those back itself (`settled.released`);
//   after a dead-letter, a release or a lease that ran out, the stream releases them, so
//   they come back in order, untried;
// - every held message is extended each third of the lease, so a slow publish does not
//   let the others' leases run out;
// - a graceful close sends `set_window(0)`, releases everything untouched, and half-closes
//   the stream once the publish in progress is answered; nothing is sent after that (a
//   write after `end()` makes Node destroy the call with the writes still buffered).

import type { Batch__Output } from './generated/txoutbox/v1/Batch';
import type { Message__Output } from './generated/txoutbox/v1/Message';
import type { SubscribeRequest } from './generated/txoutbox/v1/SubscribeRequest';
import { DeadLetter, Message, Nack, Release } from './types';

export interface SessionOptions {
  outbox: string;
  name: string;
  topics: string[];
  group: string;
  maxInFlight: number;
  leaseMs: number;
}

export class Session {
  leaseMs: number;
  readonly held = new Map<string, Message>();
  queue: Message[] = [];
  publishing: string | null = null;
  subscribed = false;
  draining = false;
  closing = false;
  halfClosed = false;

  constructor(readonly options: SessionOptions) {
    this.leaseMs = options.leaseMs;
  }

  open(): SubscribeRequest {
    const { outbox, name, topics, group, maxInFlight, leaseMs } = this.options;
    return {
      open: {
        outbox, subscriber: name, topics, group, max_in_flight: maxInFlight, lease_ms: leaseMs,
      },
    };
  }

  onBatch(batch: Batch__Output): void {
    if (this.closing || this.draining) return; // sent before the server saw us; it takes them back
    for (const proto of batch.messages) {
      const message = toMessage(proto);
      this.held.set(message.id, message);
      this.queue.push(message);
    }
  }

  /** The next message to publish, marked as publishing; `null` when there is none. */
  nextMessage(): Message | null {
    while (this.queue.length && !this.closing) {
      const message = this.queue.shift()!;
      if (this.held.has(message.id)) {
        this.publishing = message.id;
        return message;
      }
    }
    return null;
  }

  /** The requests answering `message`, whose publish resolved (`error` undefined) or threw. */
  answer(message: Message, error: unknown): SubscribeRequest[] {
    this.publishing = null;
    if (this.halfClosed || !this.held.delete(message.id)) return []; // its lease ran out
    const lease_token = message.leaseToken;
    const lease_tokens = tokens([message]);
    if (error === undefined) return [{ ack: { ids: [message.id], lease_tokens } }];
    if (error instanceof DeadLetter) {
      return [
        { dead_letter: { id: message.id, error: errorText(error.message), lease_token } },
        ...this.giveBackRestOf(message.key),
      ];
    }
    if (error instanceof Release) {
      const release = error.delayMs > 0
        ? { ids: [message.id], retry_delay_ms: Math.round(error.delayMs), lease_tokens }
        : { ids: [message.id], lease_tokens };
      return [{ release }, ...this.giveBackRestOf(message.key)];
    }
    this.laterOf(message.key); // the server gives back the later messages of the key
    if (error instanceof Nack) {
      const nack = error.retryAfterMs === undefined
        ? { id: message.id, error: errorText(error.message), lease_token }
        : { id: message.id, error: errorText(error.message), retry_delay_ms: Math.max(0, Math.round(error.retryAfterMs)), lease_token };
      return [{ nack }];
    }
    const text = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    return [{ nack: { id: message.id, error: errorText(text), lease_token } }];
  }

  onLeasesExpired(ids: string[]): SubscribeRequest[] {
    const requests: SubscribeRequest[] = [];
    for (const id of ids) {
      const message = this.held.get(id);
      if (message === undefined) continue;
      this.held.delete(id);
      requests.push(...this.giveBackRestOf(message.key));
    }
    return requests;
  }

  /** One request extending every held message, when there is any to extend (while
   * closing, the one publishing: its lease must outlast its publish). */
  extension(): SubscribeRequest | null {
    if (!this.held.size || this.halfClosed || this.leaseMs <= 0) return null;
    const held = [...this.held.values()];
    return {
      extend_lease: { ids: held.map((m) => m.id), lease_ms: this.leaseMs, lease_tokens: tokens(held) },
    };
  }

  /** Takes nothing new and gives back what is untouched (attempt refunded); the caller
   * half-closes once `readyToHalfClose`. */
  close(): SubscribeRequest[] {
    if (this.closing || this.halfClosed) return [];
    this.closing = true;
    this.queue = [];
    const untouched = [...this.held.values()].filter((m) => m.id !== this.publishing);
    for (const message of untouched) this.held.delete(message.id);
    const requests: SubscribeRequest[] = [{ set_window: { max_in_flight: 0 } }];
    if (untouched.length) {
      requests.push({ release: { ids: untouched.map((m) => m.id), lease_tokens: tokens(untouched) } });
    }
    return requests;
  }

  get readyToHalfClose(): boolean {
    return this.closing && this.publishing === null && !this.halfClosed;
  }

  private laterOf(key: string | null): Message[] {
    if (key === null) return [];
    const later = this.queue.filter((m) => m.key === key && this.held.has(m.id));
    for (const message of later) this.held.delete(message.id);
    this.queue = this.queue.filter((m) => m.key !== key);
    return later;
  }

  private giveBackRestOf(key: string | null): SubscribeRequest[] {
    const later = this.laterOf(key);
    if (!later.length) return [];
    return [{ release: { ids: later.map((m) => m.id), lease_tokens: tokens(later) } }];
  }
}

function toMessage(proto: Message__Output): Message {
  const seconds = Number(proto.created_at?.seconds ?? 0);
  const nanos = proto.created_at?.nanos ?? 0;
  return {
    id: proto.id,
    topic: proto.topic,
    // A proto3 `optional`: `_key` names it when set (with `defaults`, an absent key reads '').
    key: proto._key === 'key' ? (proto.key ?? '') : null,
    payload: Buffer.from(proto.payload ?? []),
    headers: proto.headers ?? {},
    attempts: proto.attempts,
    createdAt: new Date(seconds * 1000 + Math.floor(nanos / 1e6)),
    leaseToken: proto.lease_token ?? '',
  };
}

/** The lease tokens of `messages`, one per message in order; none at all when one is
 * missing (a server before lease tokens), since the server takes one per id or none. */
function tokens(messages: Message[]): string[] {
  const all = messages.map((m) => m.leaseToken);
  return all.every((token) => token) ? all : [];
}

/** An error text the server stores: no NUL (PostgreSQL cannot store it), at most 8 KiB. */
function errorText(text: string): string {
  return text.replace(/\0/g, '\uFFFD').slice(0, 8192);
}

/** Milliseconds before reconnection `attempt` (1, 2...): exponential from 100 ms to 10 s,
 * with jitter (between half and all of it). */
export function backoffDelayMs(attempt: number, randomFraction: number): number {
  return Math.min(10_000, 100 * 2 ** (attempt - 1)) * (0.5 + randomFraction / 2);
}

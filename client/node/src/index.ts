// Node.js client of txoutboxd, the transactional-outbox relay. A publisher subscribes to an
// outbox and hands each row to your broker; the server does the rest (leases, fencing,
// retries with backoff, dead-letters, per-key order):
//
//   import { Subscriber, Message } from 'txoutbox-client';
//
//   const subscriber = new Subscriber({ servers: '127.0.0.1:7411', outbox: 'default' });
//   await subscriber.runUntilSignal(async (message: Message) => {
//     await producer.send({ topic: message.topic, key: message.key, value: message.payload });
//   });
//
// Resolving acks the message; throw `Nack`, `DeadLetter` or `Release` to answer otherwise;
// any other error nacks it with its message. `txoutboxV1()` gives the raw gRPC stubs.

export { Subscriber } from './subscriber';
export type { Handler, SubscriberOptions } from './subscriber';
export { txoutboxV1 } from './stubs';
export {
  ConnectError,
  DeadLetter,
  Nack,
  ReconnectsExhausted,
  Release,
  SubscriberError,
  SubscriptionRefused,
} from './types';
export type {
  Credentials,
  Draining,
  LeasesExpired,
  Message,
  Reconnecting,
  Settled,
  Subscribed,
  SubscriberEvent,
} from './types';

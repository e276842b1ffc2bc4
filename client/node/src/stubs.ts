// The txoutbox.v1 stubs: loaded at run time by @grpc/proto-loader from the .proto files the
// package ships (proto/), typed by what proto-loader-gen-types generated from the same
// files at build time (src/generated/, from scripts/build.js, with these options).

import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import type { ProtoGrpcType as RelayProto } from './generated/relay';
import type { ProtoGrpcType as AdminProto } from './generated/admin';

/** The options the generated types describe; keep them equal to scripts/build.js's. */
const LOAD_OPTIONS: protoLoader.Options = {
  keepCase: true,
  longs: String, // int64 ids as decimal strings: exact beyond 2^53
  enums: String,
  defaults: true,
  oneofs: true, // `request` / `response` name the field that is set
  includeDirs: [path.join(__dirname, '..', 'proto')],
};

let loaded: (RelayProto & AdminProto)['txoutbox']['v1'] | undefined;

/** The package `txoutbox.v1`: `Relay` and `Admin` client constructors and message types. */
export function txoutboxV1(): (RelayProto & AdminProto)['txoutbox']['v1'] {
  if (loaded === undefined) {
    const definition = protoLoader.loadSync(
      ['txoutbox/v1/relay.proto', 'txoutbox/v1/admin.proto'],
      LOAD_OPTIONS,
    );
    const proto = grpc.loadPackageDefinition(definition) as unknown as RelayProto & AdminProto;
    loaded = proto.txoutbox.v1;
  }
  return loaded;
}

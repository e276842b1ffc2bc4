// Builds the package: copies the .proto files it loads at run time into proto/, generates
// their TypeScript types into src/generated/ (proto-loader-gen-types, with the options
// src/stubs.ts loads them with), then compiles src/ into dist/ with tsc. Run by
// `npm run build` and by `npm pack` (prepack). The .proto files come from the repository
// (two levels up), or from $TXOUTBOX_PROTO_DIR when the package is built elsewhere.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');

const root = path.join(__dirname, '..');
const source = process.env.TXOUTBOX_PROTO_DIR || path.join(root, '..', '..', 'proto');
const protos = ['message', 'relay', 'admin'].map((name) => `txoutbox/v1/${name}.proto`);

const missing = protos.filter((file) => !fs.existsSync(path.join(source, file)));
if (missing.length) {
  console.error(`build: ${missing.join(', ')} not found in ${source}: set TXOUTBOX_PROTO_DIR`);
  process.exit(2);
}
const target = path.join(root, 'proto');
fs.rmSync(target, { recursive: true, force: true });
for (const file of protos) {
  fs.mkdirSync(path.dirname(path.join(target, file)), { recursive: true });
  fs.copyFileSync(path.join(source, file), path.join(target, file));
}

const bin = (name) => path.join(root, 'node_modules', '.bin', name);
const generated = path.join(root, 'src', 'generated');
fs.rmSync(generated, { recursive: true, force: true });
execFileSync(bin('proto-loader-gen-types'), [
  '--grpcLib=@grpc/grpc-js', `--outDir=${generated}`, `--includeDirs=${target}`,
  // The options of `load` in src/stubs.ts: the types must describe what it returns.
  '--keepCase', '--longs=String', '--enums=String', '--defaults', '--oneofs',
  ...protos,
], { stdio: 'inherit' });

fs.rmSync(path.join(root, 'dist'), { recursive: true, force: true });
execFileSync(bin('tsc'), ['-p', root], { stdio: 'inherit' });
fs.chmodSync(path.join(root, 'dist', 'cli.js'), 0o755);

#!/usr/bin/env node
// MESH_DEBUG=1 prints a failure's stack; with source maps on before the bundle loads, it names src/ files and lines.
if (process.env.MESH_DEBUG === "1") process.setSourceMapsEnabled(true);
await import("../dist/bundle/mesh.js");

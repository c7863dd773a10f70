/**
 * The physical limit of a fan-out: how many Ed25519 signatures one core makes per second over the bytes the mesh
 * signs, measured in this process while nothing else of the bench runs in it.
 */
import type { KeyObject } from "node:crypto";
import { sign } from "../src/keys/index.js";

export function signingRate(bytes: Uint8Array, privateKey: KeyObject, forMs = 1000): number {
  // A first stretch unmeasured: the signing path warms up before it is timed.
  for (let i = 0; i < 200; i++) sign(bytes, privateKey);
  let count = 0;
  const started = performance.now();
  let now = started;
  while (now - started < forMs) {
    for (let i = 0; i < 100; i++) sign(bytes, privateKey);
    count += 100;
    now = performance.now();
  }
  return count / ((now - started) / 1000);
}

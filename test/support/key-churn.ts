/**
 * Makes keys the ways the mesh makes them, many times over with a young generation kept small, so that garbage
 * collections fall inside the exports; says how many it has made every thousand. Usage (under a small semi-space):
 * node --max-semi-space-size=1 --import tsx key-churn.ts COUNT
 */
import { newUserKey } from "../../src/bus/index.js";
import {
  encodeSigningPrivateKey,
  generateOverlayKeyPair,
  generateSigningKeyPair,
  newSigningKey,
  rawSigningPublicKey,
} from "../../src/keys/index.js";

const count = Number(process.argv[2]);
if (!Number.isInteger(count) || count < 1) throw new Error("usage: key-churn.ts COUNT");
let made = 0;
let lengths = 0;
while (made < count) {
  const user = newUserKey();
  const pair = generateSigningKeyPair();
  const node = newSigningKey();
  const overlay = generateOverlayKeyPair();
  lengths +=
    user.seed.length +
    rawSigningPublicKey(pair.publicKey).length +
    encodeSigningPrivateKey(pair.privateKey).length +
    node.pem.length +
    overlay.publicKey.length;
  made += 1;
  if (made % 1000 === 0) process.stdout.write(`made ${made}\n`);
}
process.stdout.write(`done ${made} ${lengths > 0}\n`);

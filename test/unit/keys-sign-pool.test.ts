/**
 * Signing a batch on signing threads: the same signatures `sign` makes, in the batch's order however it is split,
 * and a batch the threads could not finish fails with a clear error while the next one is signed by new threads.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { generateKeyPairSync } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { KeyError } from "../../src/errors.js";
import {
  batchSigningFrom,
  fingerprint,
  generateSigningKeyPair,
  openDeclaration,
  sealDeclaration,
  sealDeclarationTextsOffThread,
  sign,
} from "../../src/keys/index.js";
import { envelopeText, envelopeWrapping, parseDeclarationEnvelope } from "../../src/link/index.js";
import { SigningPool, signingThreads } from "../../src/keys/sign-pool.js";
import { tempDir } from "../support/tmp.js";

const key = generateSigningKeyPair();
const wrapping = envelopeWrapping(fingerprint(key.publicKey));
const encoder = new TextEncoder();
const messages = (count: number, tag = "m") =>
  Array.from({ length: count }, (_, i) => encoder.encode(`${tag}-${i}-${"x".repeat(i % 17)}`));

describe("keys — signing threads", () => {
  const pools: SigningPool[] = [];
  const pool = (size: number) => {
    const made = new SigningPool(key.privateKey, size);
    pools.push(made);
    return made;
  };
  after(async () => {
    await Promise.all(pools.map((one) => one.stop()));
  });

  test("signing threads — one a core, at most four", () => {
    assert.deepEqual([1, 2, 3, 8, 64].map(signingThreads), [1, 2, 3, 4, 4]);
  });

  for (const [size, count] of [
    [1, 5],
    [2, 7],
    [3, 2],
    [3, 250],
  ] as const) {
    test(`signing threads — ${size} thread(s), ${count} messages: the signatures sign() makes, in order`, async () => {
      const batch = messages(count, `s${size}`);
      const { signatures } = await pool(size).sealAll(batch, wrapping);
      assert.equal(signatures.length, count);
      batch.forEach((message, i) => {
        assert.deepEqual(Buffer.from(signatures[i] ?? []), Buffer.from(sign(message, key.privateKey)));
      });
    });
  }

  test("signing threads — an empty batch is signed by no thread", async () => {
    assert.deepEqual(await pool(2).sealAll([], wrapping), { signatures: [], envelopes: [] });
  });

  test("signing threads — only an Ed25519 private key is taken", () => {
    const rsa = generateKeyPairSync("rsa", { modulusLength: 1024 });
    assert.throws(() => new SigningPool(rsa.privateKey), KeyError);
    assert.throws(() => new SigningPool(key.publicKey), KeyError);
  });

  test("signing threads — stopped under a batch: that batch fails, the next is signed by new threads", async () => {
    const signing = pool(2);
    const batch = messages(20_000, "big");
    const failed = signing.sealAll(batch, wrapping).then(
      () => undefined,
      (error: unknown) => error,
    );
    await signing.stop();
    const failure = await failed;
    assert.ok(failure instanceof KeyError, `the batch failed with a KeyError, not ${String(failure)}`);
    assert.match(failure.message, /signing thread/);
    const again = messages(3, "again");
    const { signatures } = await signing.sealAll(again, wrapping);
    assert.deepEqual(
      Buffer.from(signatures[2] ?? []),
      Buffer.from(sign(again[2] ?? new Uint8Array(), key.privateKey)),
    );
  });

  for (const count of [1, batchSigningFrom - 1, batchSigningFrom, 250]) {
    test(`sealing ${count} declarations with their texts — each envelope is envelopeText's, byte for byte, and opens`, async () => {
      const signer = fingerprint(key.publicKey);
      const declarations = messages(count, "text");
      const sealed = await sealDeclarationTextsOffThread(
        declarations,
        key.privateKey,
        signer,
        envelopeWrapping(signer),
      );
      assert.equal(sealed.envelopes.length, count);
      declarations.forEach((declaration, i) => {
        const expected = envelopeText(sealDeclaration(declaration, key.privateKey, signer));
        assert.equal(new TextDecoder().decode(sealed.envelopes[i]), expected, `envelope ${i}`);
        assert.equal(sealed.signatures[i], parseDeclarationEnvelope(JSON.parse(expected)).signature);
      });
    });
  }

  test("sealing with texts on three threads — every part's envelopes in the batch's order", async () => {
    const signer = fingerprint(key.publicKey);
    const declarations = messages(251, "parts");
    const sealed = await pool(3).sealAll(declarations, envelopeWrapping(signer));
    assert.equal(sealed.envelopes.length, 251);
    declarations.forEach((declaration, i) => {
      const envelope = parseDeclarationEnvelope(JSON.parse(new TextDecoder().decode(sealed.envelopes[i])));
      assert.deepEqual(openDeclaration(envelope, key.publicKey), declaration, `envelope ${i}`);
      assert.deepEqual(
        Buffer.from(sealed.signatures[i] ?? []),
        Buffer.from(sign(declaration, key.privateKey)),
      );
    });
  });

  test("sealing declarations at once — another key's fingerprint as the signer is refused before any is signed", async () => {
    const other = generateSigningKeyPair();
    await assert.rejects(
      sealDeclarationTextsOffThread(
        messages(batchSigningFrom),
        key.privateKey,
        fingerprint(other.publicKey),
        envelopeWrapping(fingerprint(other.publicKey)),
      ),
      (error: unknown) => error instanceof KeyError && /not the fingerprint/.test(error.message),
    );
  });

  test("signing threads — a process that signed a batch on them ends on its own once its work is done", async () => {
    const dir = tempDir("mesh-sign-pool-");
    try {
      const script = join(dir.path, "sign-and-end.mts");
      const keys = new URL("../../src/keys/index.js", import.meta.url).pathname;
      const link = new URL("../../src/link/index.js", import.meta.url).pathname;
      writeFileSync(
        script,
        `import { batchSigningFrom, fingerprint, generateSigningKeyPair, sealDeclarationTextsOffThread } from ${JSON.stringify(keys)};\n` +
          `import { envelopeWrapping } from ${JSON.stringify(link)};\n` +
          "const key = generateSigningKeyPair();\n" +
          "const batch = Array.from({ length: 4 * batchSigningFrom }, (_, i) => new TextEncoder().encode(`d${i}`));\n" +
          "const signer = fingerprint(key.publicKey);\n" +
          "const { envelopes } = await sealDeclarationTextsOffThread(batch, key.privateKey, signer, envelopeWrapping(signer));\n" +
          "process.stdout.write(`${envelopes.length} sealed\\n`);\n",
      );
      const child = spawn(process.execPath, ["--import", "tsx", script], {
        stdio: ["ignore", "pipe", "pipe"],
      });
      let out = "";
      child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString("utf8")));
      child.stderr.on("data", (chunk: Buffer) => (out += chunk.toString("utf8")));
      // Generous: it ends in a second or two; a thread's port left holding the process would keep it forever.
      const ended = await new Promise<number | null | "still running">((resolve) => {
        const deadline = setTimeout(() => resolve("still running"), 60_000);
        child.once("exit", (code) => {
          clearTimeout(deadline);
          resolve(code);
        });
      });
      if (ended === "still running") child.kill("SIGKILL");
      assert.equal(ended, 0, out);
      assert.match(out, new RegExp(`^${4 * batchSigningFrom} sealed$`, "m"));
    } finally {
      dir.remove();
    }
  });
});

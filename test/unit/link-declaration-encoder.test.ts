/**
 * The fleet's declarations are encoded one composition at a time: the bytes must be exactly those `encodeMessage`
 * gives each declaration (the node verifies the signature over them, and the digest names them), and whatever
 * `encodeMessage` refuses must still be refused.
 */
import assert from "node:assert/strict";
import { generateKeyPairSync } from "node:crypto";
import { describe, test } from "node:test";
import fc from "fast-check";

import { KeyError } from "../../src/errors.js";
import { fingerprint, openDeclaration, sealDeclaration } from "../../src/keys/index.js";
import type { CheckedItems, DeclaredItem } from "../../src/link/index.js";
import {
  ContractError,
  declarationEncoder,
  encodeMessage,
  envelopeText,
  itemsDigest,
  itemsOfContents,
  keptDeclarationText,
  maxMessageBytes,
  parseDeclarationEnvelope,
} from "../../src/link/index.js";

const decoder = new TextDecoder();

const file = (path: string, content: string): DeclaredItem => ({
  type: "file",
  id: `file:${path}`,
  path,
  content,
});

/** Paths and contents with what JSON escapes: quotes, backslashes, control characters, non-ASCII. */
const text = fc.string({ unit: "grapheme", maxLength: 40 });
const itemsArbitrary = fc
  .uniqueArray(fc.stringMatching(/^[a-z0-9_-]{1,12}$/), { minLength: 0, maxLength: 6 })
  .chain((names) => fc.tuple(...names.map((name) => text.map((content) => file(`/etc/${name}`, content)))));
/** The same files as a plan's unit holds them, for items made as compose makes them (`itemsOfContents`). */
const plannedFiles = fc
  .uniqueArray(fc.stringMatching(/^[a-z0-9_-]{1,12}$/), { minLength: 0, maxLength: 6 })
  .chain((names) =>
    fc.tuple(
      ...names.map((name) =>
        text.map((content) => ({ type: "file" as const, path: `/etc/${name}`, content })),
      ),
    ),
  );
const header = fc.record({
  node: fc.stringMatching(/^[a-z][a-z0-9-]{0,20}[a-z0-9]$/),
  epoch: fc.integer({ min: 0, max: 2 ** 40 }),
  sequence: fc.integer({ min: 1, max: 2 ** 40 }),
  issued_at: fc
    .date({
      min: new Date("2020-01-01T00:00:00Z"),
      max: new Date("2100-01-01T00:00:00Z"),
      noInvalidDate: true,
    })
    .map((date) => date.toISOString()),
});

describe("declarationEncoder", () => {
  test("gives, for every node of a composition, exactly the bytes encodeMessage gives", () => {
    fc.assert(
      fc.property(itemsArbitrary, fc.array(header, { minLength: 1, maxLength: 5 }), (items, headers) => {
        const digest = itemsDigest(items);
        const encode = declarationEncoder(items, digest);
        for (const one of headers) {
          const expected = encodeMessage({ kind: "declaration", ...one, items: [...items], digest });
          const bytes = encode(one);
          assert.equal(decoder.decode(bytes), decoder.decode(expected));
          assert.deepEqual(Buffer.from(bytes), Buffer.from(expected), "byte for byte");
        }
      }),
      { numRuns: 300 },
    );
  });

  test("refuses a bad item at the first node, and a bad header at any node", () => {
    const items = [file("/etc/a", "a\n")];
    const digest = itemsDigest(items);
    const good = { node: "web-1", epoch: 3, sequence: 7, issued_at: "2026-11-30T12:00:00.000Z" };

    const clashing = [file("/etc/a", "a\n"), file("/etc/a", "b\n")];
    assert.throws(
      () => declarationEncoder(clashing, itemsDigest(clashing))(good),
      (error: unknown) =>
        error instanceof ContractError && /repeats an earlier item's id/.test(error.message),
    );

    const encode = declarationEncoder(items, digest);
    encode(good);
    for (const bad of [
      { ...good, node: "Web 1" },
      { ...good, epoch: -1 },
      { ...good, sequence: 0 },
      { ...good, sequence: 1.5 },
      { ...good, issued_at: "yesterday" },
    ]) {
      assert.throws(
        () => encode(bad),
        (error: unknown) =>
          error instanceof ContractError &&
          /declaration\.(node|epoch|sequence|issued_at):/.test(error.message),
        JSON.stringify(bad),
      );
    }
    assert.throws(() => declarationEncoder(items, "sha256:nope")(good), ContractError);
  });

  test("with items checked once for a roll-out, gives each composition exactly the bytes encodeMessage gives", () => {
    fc.assert(
      fc.property(
        plannedFiles,
        fc.array(fc.array(fc.nat(), { maxLength: 6 }), { minLength: 1, maxLength: 6 }),
        header,
        (drawn, picks, one) => {
          // Compositions made of the pool's item objects, shared between them as a roll-out's units' items are; each
          // item as compose makes it (through the item's schema).
          const pool = itemsOfContents({ files: drawn });
          const checked: CheckedItems = new WeakMap();
          for (const pick of picks) {
            const items = [...new Set(pick.map((index) => pool[index % Math.max(pool.length, 1)]))].filter(
              (item): item is DeclaredItem => item !== undefined,
            );
            const digest = itemsDigest(items);
            const expected = encodeMessage({ kind: "declaration", ...one, items: [...items], digest });
            const encode = declarationEncoder(items, digest, checked);
            assert.deepEqual(Buffer.from(encode(one)), Buffer.from(expected), "byte for byte");
            assert.equal(encode.itemsText, JSON.stringify(items));
            for (const item of items) assert.equal(checked.get(item), JSON.stringify(item));
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  test("with items checked once for a roll-out, refuses what a whole check refuses, in its words", () => {
    const good = { node: "web-1", epoch: 3, sequence: 7, issued_at: "2026-11-30T12:00:00.000Z" };
    const checked: CheckedItems = new WeakMap();
    const [shared] = itemsOfContents({ files: [{ type: "file", path: "/etc/a", content: "a\n" }] });
    if (shared === undefined) throw new Error("no item was made");
    const refusals: Array<[string, DeclaredItem[], RegExp]> = [
      ["two items under one id", [shared, file("/etc/a", "b\n")], /repeats an earlier item's id/],
      [
        "an id that is not the item's",
        [shared, { ...file("/etc/b", "b\n"), id: "file:/etc/c" }],
        /expected "file:\/etc\/b"/,
      ],
      ["a relative path", [shared, file("etc/b", "b\n")], /declaration\.items\[1\]\.path/],
    ];
    for (const [what, items, words] of refusals) {
      const digest = itemsDigest(items);
      const whole = () => declarationEncoder(items, digest)(good);
      const inParts = () => declarationEncoder(items, digest, checked)(good);
      assert.throws(
        whole,
        (error: unknown) => error instanceof ContractError && words.test(error.message),
        what,
      );
      const told = (() => {
        try {
          whole();
        } catch (error) {
          return (error as Error).message;
        }
        return "";
      })();
      assert.throws(
        inParts,
        (error: unknown) => error instanceof ContractError && error.message === told,
        what,
      );
    }
    assert.equal(checked.get(shared), JSON.stringify(shared), "the item that passed is kept as checked");
    // The first header and the digest of a composition, checked by hand in parts: refused in the whole check's words.
    const sameRefusal = (inParts: () => unknown, whole: () => unknown, what: string) => {
      let told = "";
      assert.throws(
        whole,
        (error: unknown) => error instanceof ContractError && (told = error.message) !== "",
      );
      assert.throws(
        inParts,
        (error: unknown) => error instanceof ContractError && error.message === told,
        what,
      );
    };
    sameRefusal(
      () => declarationEncoder([shared], "sha256:nope", checked)(good),
      () => declarationEncoder([shared], "sha256:nope")(good),
      "a digest that is not one",
    );
    const sharedDigest = itemsDigest([shared]);
    // A list holding a digest reads as one to a regex (it is made a string first); the schema refuses it.
    const listed = [sharedDigest] as unknown as string;
    sameRefusal(
      () => declarationEncoder([shared], listed, checked)(good),
      () => declarationEncoder([shared], listed)(good),
      "a digest in a list",
    );
    for (const [what, header] of [
      ["sequence 0", { ...good, sequence: 0 }],
      ["an epoch below 0", { ...good, epoch: -1 }],
      ["a node name with capitals", { ...good, node: "Web-1" }],
      ["a time without its zone", { ...good, issued_at: "2026-11-30T12:00:00" }],
      ["a field more", { ...good, extra: 1 } as unknown as typeof good],
    ] as const) {
      sameRefusal(
        () => declarationEncoder([shared], sharedDigest, checked)(header),
        () => declarationEncoder([shared], sharedDigest)(header),
        what,
      );
    }
    // Keys in another order than the schema's: the whole check, which writes them in its order, decides the bytes.
    const reordered = { content: "c\n", path: "/etc/c", id: "file:/etc/c", type: "file" } as DeclaredItem;
    const digest = itemsDigest([reordered]);
    assert.deepEqual(
      Buffer.from(declarationEncoder([reordered], digest, checked)(good)),
      Buffer.from(encodeMessage({ kind: "declaration", ...good, items: [reordered], digest })),
    );
    assert.equal(checked.get(reordered), undefined, "an item its check would change is not kept as checked");
  });

  test("refuses a declaration past the size every message keeps to", () => {
    const items = [file("/etc/big", "x".repeat(400 * 1024)), file("/etc/big2", "y".repeat(400 * 1024))];
    const digest = itemsDigest(items);
    const encode = declarationEncoder(items, digest);
    const one = { node: "big-1", epoch: 1, sequence: 1, issued_at: "2026-11-30T12:00:00.000Z" };
    const bytes = encode(one);
    assert.ok(bytes.byteLength < maxMessageBytes);
    // Its envelope, in base64, no longer fits.
    const { privateKey, publicKey } = generateKeyPairSync("ed25519");
    assert.throws(
      () => envelopeText(sealDeclaration(bytes, privateKey, fingerprint(publicKey))),
      (error: unknown) =>
        error instanceof ContractError && /declaration_envelope: is \d+ bytes, at most/.test(error.message),
    );
  });
});

describe("envelopeText", () => {
  test("is the text encodeMessage gives the envelope", () => {
    const { privateKey, publicKey } = generateKeyPairSync("ed25519");
    const signer = fingerprint(publicKey);
    fc.assert(
      fc.property(itemsArbitrary, header, (items, one) => {
        const digest = itemsDigest(items);
        const envelope = sealDeclaration(declarationEncoder(items, digest)(one), privateKey, signer);
        assert.equal(envelopeText(envelope), decoder.decode(encodeMessage(envelope)));
      }),
      { numRuns: 100 },
    );
  });
});

describe("keptDeclarationText", () => {
  test("rebuilds, from the header, the items' text and the seal, the envelope that was sent, byte for byte", () => {
    const { privateKey, publicKey } = generateKeyPairSync("ed25519");
    const signer = fingerprint(publicKey);
    fc.assert(
      fc.property(itemsArbitrary, header, (items, one) => {
        const digest = itemsDigest(items);
        const encode = declarationEncoder(items, digest);
        const envelope = sealDeclaration(encode(one), privateKey, signer);
        const itemsText = encode.itemsText;
        assert.ok(itemsText !== undefined, "the items' text is known once one declaration was encoded");
        const rebuilt = keptDeclarationText({
          header: one,
          itemsText,
          digest,
          signature: envelope.signature,
          signer: envelope.signer,
        });
        assert.equal(rebuilt, envelopeText(envelope));
        assert.deepEqual(
          openDeclaration(parseDeclarationEnvelope(JSON.parse(rebuilt)), publicKey),
          encode(one),
        );
      }),
      { numRuns: 100 },
    );
  });

  test("a kept declaration whose parts were altered no longer opens: the node refuses it", () => {
    const { privateKey, publicKey } = generateKeyPairSync("ed25519");
    const items = [file("/etc/motd", "hello\n")];
    const digest = itemsDigest(items);
    const encode = declarationEncoder(items, digest);
    const one = { node: "kept-1", epoch: 3, sequence: 9, issued_at: "2026-11-30T12:00:00.000Z" };
    const { signature, signer } = sealDeclaration(encode(one), privateKey, fingerprint(publicKey));
    const kept = { header: one, itemsText: encode.itemsText ?? "", digest, signature, signer };
    const altered = [
      { ...kept, header: { ...one, sequence: 10 } },
      { ...kept, itemsText: JSON.stringify([file("/etc/motd", "changed\n")]) },
    ];
    for (const one of altered) {
      const envelope = parseDeclarationEnvelope(JSON.parse(keptDeclarationText(one)));
      assert.throws(() => openDeclaration(envelope, publicKey), KeyError);
    }
    assert.throws(
      () => keptDeclarationText({ ...kept, header: { ...one, node: "Not A Node" } }),
      (error: unknown) => error instanceof ContractError && /declaration/.test(error.message),
    );
  });
});

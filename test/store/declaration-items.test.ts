/**
 * Each composition's items are kept once, however many nodes were sent them; a declaration keeps its header, the
 * key of its items and its seal, and its envelope is rebuilt from those byte for byte. Declarations kept before
 * this (their envelope whole) read back as they were, and a composition no declaration refers to any more goes
 * once it has been unused for a day.
 */
import assert from "node:assert/strict";
import { generateKeyPairSync } from "node:crypto";
import { describe, test } from "node:test";
import SqliteDatabase from "better-sqlite3";
import pg from "pg";
import { fingerprint, openDeclaration, sealDeclaration } from "../../src/keys/index.js";
import type { DeclaredItem } from "../../src/link/index.js";
import {
  declarationEncoder,
  envelopeText,
  itemsDigest,
  parseDeclarationEnvelope,
} from "../../src/link/index.js";
import type { NewDeclaration, Store } from "../../src/store/index.js";
import { itemsKeptUnusedMs, keptItems, openStore } from "../../src/store/index.js";
import type { StoreBackend } from "../support/stores.js";
import {
  enrolled,
  freshStoreForSuite,
  migrateStoreTo,
  rawStoreDb,
  storeBackends,
} from "../support/stores.js";

const options = { historyLimit: 3 };
const { privateKey, publicKey } = generateKeyPairSync("ed25519");
const signer = fingerprint(publicKey);

const file = (path: string, content: string): DeclaredItem => ({
  type: "file",
  id: `file:${path}`,
  path,
  content,
});

/** Declarations of one composition for `nodes`, sealed as a roll-out seals them: what is kept, and what was sent. */
function sealed(
  nodes: readonly string[],
  items: DeclaredItem[],
  sequence: number,
  issuedAt: string,
): { kept: NewDeclaration[]; sent: Map<string, string> } {
  const digest = itemsDigest(items);
  const encode = declarationEncoder(items, digest);
  const sent = new Map<string, string>();
  const kept = nodes.map((node) => {
    const envelope = sealDeclaration(
      encode({ node, epoch: 2, sequence, issued_at: issuedAt }),
      privateKey,
      signer,
    );
    sent.set(node, envelopeText(envelope));
    return {
      node,
      sequence,
      epoch: 2,
      issuedAt,
      digest,
      items: keptItems(encode.itemsText ?? ""),
      signature: envelope.signature,
      signer: envelope.signer,
      units: ["motd"],
    };
  });
  return { kept, sent };
}

/** A statement run on the store's database over a connection of its own, as an operator's SQL client would. */
async function rawQuery(
  backend: StoreBackend,
  url: string,
  text: string,
): Promise<Record<string, unknown>[]> {
  if (backend.name === "sqlite") {
    const file = new SqliteDatabase(url.slice("sqlite:".length));
    try {
      return file.prepare(text).all() as Record<string, unknown>[];
    } finally {
      file.close();
    }
  }
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query(text)).rows as Record<string, unknown>[];
  } finally {
    await client.end();
  }
}

for (const backend of storeBackends) {
  describe(`declarations kept apart from their compositions (${backend.name})`, () => {
    let store: Store;
    let url: string;
    freshStoreForSuite(backend, options, (opened, at) => {
      store = opened;
      url = at;
    });

    test("a composition sent to many nodes is kept once; each envelope reads back as sent and opens", async () => {
      const at = new Date("2026-12-01T10:00:00.000Z");
      const nodes = Array.from({ length: 40 }, (_, i) => `o${i}-once`);
      for (const node of nodes) await enrolled(store, node, at);
      const motd = sealed(nodes.slice(0, 30), [file("/etc/motd", 'hello "fleet" ✓\n')], 1, at.toISOString());
      const other = sealed(
        nodes.slice(30),
        [file("/etc/motd", "other\n"), file("/etc/x", "x")],
        1,
        at.toISOString(),
      );
      await store.declarations.recordMany([...motd.kept.slice(0, 20), ...other.kept.slice(0, 5)]);
      await store.declarations.recordMany([...motd.kept.slice(20), ...other.kept.slice(5)]);
      const rows = await rawQuery(backend, url, "select key, items from declaration_items");
      assert.deepEqual(
        rows.map((row) => row.key).sort(),
        [motd.kept[0]?.items.key, other.kept[0]?.items.key].sort(),
        "one row per composition",
      );
      const envelopes = await rawQuery(
        backend,
        url,
        "select count(*) as n from declarations where node like '%-once' and envelope is null",
      );
      assert.equal(Number(envelopes[0]?.n), 40, "no declaration keeps an envelope of its own");
      for (const [node, envelope] of [...motd.sent, ...other.sent]) {
        const latest = await store.declarations.latest(node);
        assert.equal(latest?.envelope, envelope, `${node}'s envelope as it was sent`);
        assert.ok(
          openDeclaration(parseDeclarationEnvelope(JSON.parse(latest.envelope)), publicKey).byteLength > 0,
        );
      }
    });

    test("a composition the caller names as kept is not written again; its declarations still read back", async () => {
      const at = new Date("2026-12-01T12:00:00.000Z");
      const nodes = ["ka-kept", "kb-kept"];
      for (const node of nodes) await enrolled(store, node, at);
      const items = [file("/etc/kept", "kept once\n")];
      const first = sealed(nodes.slice(0, 1), items, 1, at.toISOString());
      await store.declarations.recordMany(first.kept);
      const key = first.kept[0]?.items.key ?? "";
      // Later than the hour after which a use is written again: without the caller's word, this would write it.
      const later = new Date(at.getTime() + 2 * 60 * 60_000).toISOString();
      const second = sealed(nodes.slice(1), items, 1, later);
      await store.declarations.recordMany(second.kept, new Set([key]));
      const rows = await rawQuery(backend, url, `select used_at from declaration_items where key = '${key}'`);
      assert.deepEqual(
        rows.map((row) => row.used_at),
        [at.toISOString()],
        "the composition was not written again",
      );
      assert.equal((await store.declarations.latest("kb-kept"))?.envelope, second.sent.get("kb-kept"));
      // Not named as kept, the same later use is written.
      const third = sealed(nodes.slice(1), items, 2, later);
      await store.declarations.recordMany(third.kept);
      const after = await rawQuery(
        backend,
        url,
        `select used_at from declaration_items where key = '${key}'`,
      );
      assert.deepEqual(
        after.map((row) => row.used_at),
        [later],
      );
    });

    test("a composition no declaration refers to goes once unused for a day; one referred to or used stays", async () => {
      const day0 = new Date("2026-12-01T00:00:00.000Z");
      await enrolled(store, "pa-days", day0);
      await enrolled(store, "pb-held", day0);
      // pa-days is sent four compositions, one a day, the last as its tenth declaration (a history is trimmed at
      // every tenth): the first falls out of its history of three.
      const days = [0, 1, 2, 3].map((day) => new Date(day0.getTime() + day * 24 * 60 * 60_000).toISOString());
      const composition = (day: number) => [file("/etc/day", `day ${day}\n`)];
      const keys: string[] = [];
      for (const [day, issuedAt] of days.entries()) {
        const { kept } = sealed(["pa-days"], composition(day), day === 0 ? 1 : day + 7, issuedAt);
        keys.push(kept[0]?.items.key ?? "");
        await store.declarations.recordMany(kept);
      }
      // pb-held holds day 0's composition too, sent on day 0: referred to, it stays however old.
      const held = sealed(["pb-held"], [file("/etc/held", "held\n")], 1, days[0] ?? "").kept;
      await store.declarations.recordMany(held);
      const keyOf = (day: number) => keys[day];
      const kept = async () =>
        new Set((await rawQuery(backend, url, "select key from declaration_items")).map((row) => row.key));
      assert.ok((await kept()).has(keyOf(0)), "day 0's composition is still there before the retention");
      assert.deepEqual(
        (await store.declarations.history("pa-days")).map((one) => one.sequence),
        [10, 9, 8],
        "day 0's declaration fell out of pa-days's history",
      );
      // The retention run at `now` prunes what was last used a day or more before it.
      const pruneAt = (now: number) =>
        store.declarations.pruneItems(new Date(now - itemsKeptUnusedMs).toISOString());
      // A day after day 0's last use less a minute: not yet.
      assert.equal(await pruneAt(Date.parse(days[0] ?? "") + itemsKeptUnusedMs - 60_000), 0);
      assert.ok((await kept()).has(keyOf(0)));
      // A day and a minute after the last roll-out, day 0's composition goes; pb-held's, as old, stays (referred
      // to), and so do the others.
      assert.equal(await pruneAt(Date.parse(days[3] ?? "") + itemsKeptUnusedMs + 60_000), 1);
      const left = await kept();
      assert.ok(!left.has(keyOf(0)), "day 0's composition was pruned");
      for (const day of [1, 2, 3]) assert.ok(left.has(keyOf(day)), `day ${day}'s composition stays`);
      assert.ok(left.has(held[0]?.items.key), "a composition a declaration refers to stays");
      // Every kept declaration still reads back whole.
      for (const node of ["pa-days", "pb-held"]) {
        for (const one of await store.declarations.history(node)) {
          assert.ok(
            openDeclaration(parseDeclarationEnvelope(JSON.parse(one.envelope)), publicKey).byteLength > 0,
          );
        }
      }
    });
  });

  describe(`declarations kept before their compositions were kept apart (${backend.name})`, () => {
    test("read back as they were, beside the ones kept since", async () => {
      const location = await backend.fresh();
      try {
        // The store as the release before left it: every migration up to the one that keeps compositions apart.
        const db = rawStoreDb(location.url);
        const envelope = (() => {
          const items = [file("/etc/old", "kept whole\n")];
          const bytes = declarationEncoder(
            items,
            itemsDigest(items),
          )({
            node: "old-1",
            epoch: 1,
            sequence: 1,
            issued_at: "2026-11-01T00:00:00.000Z",
          });
          return {
            text: envelopeText(sealDeclaration(bytes, privateKey, signer)),
            digest: itemsDigest(items),
          };
        })();
        try {
          await migrateStoreTo(db, backend.name, "0013_valid_tokens_by_expiry");
          await db
            .insertInto("nodes" as never)
            .values({ name: "old-1", state: "enrolled", created_at: "2026-11-01T00:00:00.000Z" })
            .execute();
          await db
            .insertInto("declarations" as never)
            .values({
              node: "old-1",
              sequence: 1,
              epoch: 1,
              issued_at: "2026-11-01T00:00:00.000Z",
              digest: envelope.digest,
              envelope: envelope.text,
              units: '["old"]',
            })
            .execute();
        } finally {
          await db.destroy();
        }
        const store = await openStore(location.url, options);
        try {
          const newer = sealed(["old-1"], [file("/etc/old", "kept apart\n")], 2, "2026-12-01T00:00:00.000Z");
          await store.declarations.recordMany(newer.kept);
          const history = await store.declarations.history("old-1");
          assert.deepEqual(
            history.map((one) => [one.sequence, one.envelope, one.units]),
            [
              [2, newer.sent.get("old-1"), ["motd"]],
              [1, envelope.text, ["old"]],
            ],
          );
        } finally {
          await store.close();
        }
      } finally {
        await location.cleanup();
      }
    });
  });
}

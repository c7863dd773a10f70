/**
 * A fresh PostgreSQL database per test run on the machine's server (MESH_TEST_POSTGRES, default
 * postgres://postgres@127.0.0.1:5432/test), dropped afterwards.
 */
import { randomBytes } from "node:crypto";
import pg from "pg";

export const adminUrl = process.env.MESH_TEST_POSTGRES ?? "postgres://postgres@127.0.0.1:5432/test";

export interface ScratchDatabase {
  url: string;
  drop(): Promise<void>;
}

export async function scratchDatabase(): Promise<ScratchDatabase> {
  const name = `mesh_test_${process.pid}_${randomBytes(4).toString("hex")}`;
  await admin(`create database ${name}`);
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    drop: async () => {
      // A closed pool's connections take a moment to leave the server; forcing them out earlier makes them
      // report an error to a pool that was already closed.
      await waitForNoConnections(name, 3000);
      await admin(`drop database if exists ${name} with (force)`);
    },
  };
}

async function waitForNoConnections(database: string, timeoutMs: number): Promise<void> {
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const result = await client.query<{ n: string }>(
        "select count(*) as n from pg_stat_activity where datname = $1",
        [database],
      );
      if (result.rows[0]?.n === "0") return;
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
  } finally {
    await client.end();
  }
}

async function admin(statement: string): Promise<void> {
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    await client.query(statement);
  } finally {
    await client.end();
  }
}

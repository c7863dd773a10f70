/** The store backends every store test runs against: a SQLite file and a fresh PostgreSQL database. */
import { join } from "node:path";
import { scratchDatabase } from "./postgres.js";
import { tempDir } from "./tmp.js";

export interface StoreBackend {
  name: "sqlite" | "postgres";
  /** Makes a fresh, empty store location; `cleanup` removes it. */
  fresh(): Promise<{ url: string; cleanup(): Promise<void> }>;
}

export const storeBackends: readonly StoreBackend[] = [
  {
    name: "sqlite",
    fresh() {
      const dir = tempDir("mesh-store-");
      return Promise.resolve({
        url: `sqlite:${join(dir.path, "mesh.db")}`,
        cleanup: () => Promise.resolve(dir.remove()),
      });
    },
  },
  {
    name: "postgres",
    async fresh() {
      const database = await scratchDatabase();
      return { url: database.url, cleanup: () => database.drop() };
    },
  },
];

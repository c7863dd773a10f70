/** The end-to-end scenario (flow-scenario.ts) on `mesh up` with its own nats-server in operator mode. */
import { flowScenario } from "./flow-scenario.js";

flowScenario("nats");

#!/usr/bin/env node
import "../dist/bundle/mesh.js";

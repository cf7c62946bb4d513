/* The Hostile fixture exports only the plugin entry (bgtask/plugin.h). */
